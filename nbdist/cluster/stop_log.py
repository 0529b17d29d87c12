"""The cluster's process logs when it stops: kept in one file, not printed.

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
import logging
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["launchers_of", "quiet_stop_log", "write_log"]


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


class _StoppedClusters(logging.Filter):
    """Drops ipyparallel's records below ERROR that name a cluster the user stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster_ids: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not self.cluster_ids:
            return True
        message = record.getMessage()
        return not any(cluster_id in message for cluster_id in self.cluster_ids)


_STOPPED = _StoppedClusters()


@contextlib.contextmanager
def quiet_stop_log(ipp_cluster: Any) -> Iterator[None]:
    """Keep ipyparallel from printing a process's whole log while the cluster is being stopped.

    On a busy machine the controller can take longer to exit than ipyparallel waits; it then
    reports a non-zero exit and dumps the controller's log under `%dist stop`'s one line. A
    stop the user asked for is not a crash: its messages stay at ERROR and above, also those
    ipyparallel logs later, when it learns that a process it killed has exited (they name the
    cluster's id: `_StoppedClusters`). An engine that crashes while the cluster runs is still
    reported, with its output, as before.
    """
    log = getattr(ipp_cluster, "log", None)
    logger = getattr(log, "logger", log)
    if not isinstance(logger, logging.Logger):
        yield
        return
    if _STOPPED not in logger.filters:
        logger.addFilter(_STOPPED)
    _STOPPED.cluster_ids.add(str(getattr(ipp_cluster, "cluster_id", "")) or "?")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
