"""The cluster's process logs, kept in one file when the cluster stops.

ipyparallel sends each engine's and the controller's output to a file in the profile's `log`
folder and deletes those files when it stops them. nbdist keeps what they said in one file per
cluster, `<profile>/log/nbdist-<cluster_id>.log` (owner-only), so `%dist stop` prints one line
that names it: a normal stop shows no process output, and nothing is lost when a user wants to
know what an engine printed. Imports nothing from ipyparallel; it reads the launchers' output.

Example:
    >>> import tempfile
    >>> path = write_log([], tempfile.mkdtemp(), "c1")
    >>> path.endswith("nbdist-c1.log")
    True
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

__all__ = ["launchers_of", "write_log"]


def launchers_of(ipp_cluster: Any) -> list[tuple[str, Any]]:
    """The controller's and each engine set's launcher, named, before they are stopped.

    ipyparallel forgets its launchers as it stops them, but each keeps its output once read.
    """
    found: list[tuple[str, Any]] = []
    controller = getattr(ipp_cluster, "controller", None)
    if controller is not None:
        found.append(("controller", controller))
    for name, engine_set in list(getattr(ipp_cluster, "engines", {}).items()):
        found.append((f"engines {name}", engine_set))
    return found


def write_log(launchers: list[tuple[str, Any]], profile_dir: str, cluster_id: str) -> str:
    """Write every launcher's output to `<profile_dir>/log/nbdist-<cluster_id>.log`.

    Returns:
        The file's path. A launcher whose output cannot be read is noted, not raised: a
        stop never fails because of its log.
    """
    folder = os.path.join(profile_dir, "log")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"nbdist-{cluster_id}.log")
    sections = []
    for name, launcher in launchers:
        try:
            text = launcher.get_output() or ""
        except Exception as error:  # a launcher's output is best effort
            text = f"(its output could not be read: {type(error).__name__}: {error})\n"
        sections.append(f"===== {name} =====\n{text.rstrip()}\n")
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write("\n".join(sections))
    return path
