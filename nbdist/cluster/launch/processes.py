"""`ProcessSet`: the processes of a cluster, remembered so that `stop()` can wait for them all.

ipyparallel stops the controller and engines it launched, but not every process they start:
each engine's nanny is its child (in a session of its own), and once the engine has exited it
is no longer a descendant of the notebook, so nothing waits for it. A `ProcessSet` records the
whole tree while it is visible and, at stop, terminates and waits for whatever is left under a
deadline, then kills the rest. Imports psutil when used.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["KILL_GRACE_S", "ProcessSet", "pid_alive"]

KILL_GRACE_S = 5.0
"""Seconds given to processes to exit after SIGTERM (and again after SIGKILL)."""

_LOG = logging.getLogger(__name__)


class ProcessSet:
    """Processes (and their descendants) seen so far, keyed by pid and start time.

    Example:
        >>> import os
        >>> processes = ProcessSet()
        >>> processes.record([os.getpid(), None])
        >>> processes.pids == (os.getpid(),)
        True
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[int, float], Any] = {}

    def record(self, roots: Iterable[Any]) -> None:
        """Add each root (a pid or a `psutil.Process`; None is skipped) and its descendants."""
        import psutil

        for root in roots:
            if root is None:
                continue
            with contextlib.suppress(psutil.Error):
                process = root if isinstance(root, psutil.Process) else psutil.Process(root)
                for member in [process, *process.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        self._seen[(member.pid, member.create_time())] = member

    def forget(self, pids: Iterable[int]) -> None:
        """Stop tracking `pids` (a process that outlives this set, e.g. a kept zygote)."""
        drop = set(pids)
        self._seen = {key: p for key, p in self._seen.items() if key[0] not in drop}

    @property
    def pids(self) -> tuple[int, ...]:
        """The recorded pids, sorted."""
        return tuple(sorted(pid for pid, _ in self._seen))

    def reap(self, grace: float = KILL_GRACE_S) -> None:
        """Terminate what is still running, wait up to `grace` s, kill the rest, wait again."""
        import psutil

        alive = [p for p in self._seen.values() if _running(p)]
        if not alive:
            return
        for process in alive:  # what the launcher's stop left behind: the cluster is going away
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        _, alive = psutil.wait_procs(alive, timeout=KILL_GRACE_S)
        if alive:
            _LOG.warning("Processes still running after SIGKILL: %s", [p.pid for p in alive])


def pid_alive(pid: int) -> bool:
    """True when `pid` runs and is not a zombie."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running(process: Any) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
