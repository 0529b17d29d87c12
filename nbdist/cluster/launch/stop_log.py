"""The cluster's process logs when it stops: kept in one file, not printed.

ipyparallel sends each engine's and the controller's output to a file in the profile's `log`
folder and deletes those files when it stops them. nbdist keeps what they said in one file per
cluster, `<profile>/log/nbdist-<cluster_id>.log` (owner-only), so `%dist stop` prints one line
that names it: a normal stop shows no process output, and nothing is lost when a user wants to
know what an engine printed. Imports nothing from ipyparallel; it reads the launchers' output.

An engine (or the controller) that exits while the cluster runs is kept out of the notebook
the same way (`keep_crash_output`): ipyparallel logs the last 100 lines its process printed
(the engine's own debug log, "[Engine.1] Handling apply_request: …") as one warning, which a
Jupyter kernel shows in the cell that is running. nbdist appends those lines to the same file
and shows one line naming it instead. What the user's code printed on that engine is not in
them: it reached the cell through the engine's output stream, as it was printed.

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
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["keep_crash_output", "launchers_of", "log_path", "quiet_stop_log", "write_log"]

_OUTPUT_FORMAT = "Output for %s:\n%s"  # ipyparallel's launcher, when its process has exited


def log_path(profile_dir: str, cluster_id: str) -> str:
    """`<profile_dir>/log/nbdist-<cluster_id>.log`, the cluster's one log file (folder made)."""
    folder = os.path.join(profile_dir, "log")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, f"nbdist-{cluster_id}.log")


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
    path = log_path(profile_dir, cluster_id)
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


class _CrashOutput(logging.Filter):
    """Moves ipyparallel's "Output for <process>" records of one cluster into its log file."""

    def __init__(
        self, profile_dir: str, cluster_id: str, name_of: Callable[[Any], str | None] | None
    ) -> None:
        super().__init__()
        self.profile_dir = profile_dir
        self.cluster_id = cluster_id
        self.name_of = name_of

    def _name(self, identifier: Any) -> str:
        name = None
        if self.name_of is not None:
            with contextlib.suppress(Exception):  # a name is a courtesy; the file is the point
                name = self.name_of(identifier)
        return name or _process_name(identifier)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _OUTPUT_FORMAT or not isinstance(record.args, tuple):
            return True
        if len(record.args) != 2:
            return True
        identifier, output = record.args
        name = self._name(identifier)
        path = log_path(self.profile_dir, self.cluster_id)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        with contextlib.suppress(OSError):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(descriptor, "a") as file:
                file.write(f"===== {name}, exited at {stamp} =====\n")
                file.write(f"{str(output).rstrip()}\n")
        if record.levelno < logging.WARNING:  # a normal exit: kept, not announced
            return False
        record.msg = "[nbdist] %s exited unexpectedly; what its process printed is in %s"
        record.args = (name, path)
        return True


def _process_name(identifier: Any) -> str:
    text = str(identifier)
    return text if text.startswith(("ipcontroller", "controller")) else f"engine process {text}"


def keep_crash_output(
    log: Any,
    profile_dir: str,
    cluster_id: str,
    name_of: Callable[[Any], str | None] | None = None,
) -> None:
    """Send what a process of this cluster printed before it exited to the cluster's log file
    (`log_path`) instead of the notebook, which sees one line naming the file.

    `log` is the ipyparallel cluster's own logger (its launchers log through it); `name_of`
    names a process from its launcher's identifier (e.g. "replica 1's engine (pid 4242)"), or
    returns None for the default ("engine process 1").
    """
    logger = getattr(log, "logger", log)
    if not isinstance(logger, logging.Logger):
        return
    if not any(isinstance(f, _CrashOutput) for f in logger.filters):
        logger.addFilter(_CrashOutput(profile_dir, cluster_id, name_of))
