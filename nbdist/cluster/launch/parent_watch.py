"""`watch_parent`: a cluster process that outlives the process that started it stops itself.

Engines and the controller run as children of the notebook's kernel (or of whatever started
`nd.Cluster`). `Cluster.stop()` and the kernel's exit handlers stop them, but a kernel that is
killed (SIGKILL, an out-of-memory kill, a restart that kills it, SIGTERM or SIGHUP without
Python's handlers) runs none of that, and the children would keep their memory and ports
forever. So every engine and the controller start `watch_parent()` first: a daemon thread that
notices when the process's parent changes (it died, and the process was re-parented to init or
a subreaper), then stops the process's own children by pid, asks the process to stop (SIGTERM,
which ipyparallel handles by stopping its event loop) and, if it is still there a few seconds
later (its main thread blocked in C), exits it. Nothing is ever killed by name.

The parent's pid is polled (Linux's `PR_SET_PDEATHSIG` would be faster, but it fires when the
*thread* that started the process exits, and ipyparallel starts processes from helper threads).
Imports psutil when the parent dies, not before.

Example:
    >>> watch_parent(poll_s=0.5, parent=1) is None  # started by init: nothing to watch
    True
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

__all__ = [
    "NO_PARENT_FLAG",
    "ORPHAN_EXIT_CODE",
    "PARENT_FLAG",
    "parent_flag",
    "stop_orphan",
    "watch_parent",
]

ORPHAN_EXIT_CODE = 75
"""The exit status of a cluster process that stopped itself because its parent died."""

_GRACE_S = 3.0

PARENT_FLAG = "--nbdist-parent="
"""First argument of a cluster process's command: the pid of the process that starts it."""


def parent_flag() -> str:
    """The argument naming this process as the parent of the cluster process it starts.

    A process started with it knows whom to outlive even when that parent died before the
    child could look (its `getppid()` is then already init's or a subreaper's).

    Example:
        >>> parent_flag() == f"--nbdist-parent={os.getpid()}"
        True
    """
    return f"{PARENT_FLAG}{os.getpid()}"


def _parent_from_argv() -> int | None:
    """Remove `--nbdist-parent=PID` from `sys.argv` (ipyparallel would refuse it); its PID."""
    import sys

    for index, argument in enumerate(sys.argv[1:], start=1):
        if argument.startswith(PARENT_FLAG):
            del sys.argv[index]
            with contextlib.suppress(ValueError):
                return int(argument[len(PARENT_FLAG) :])
            return None
    return None


NO_PARENT_FLAG = "--nbdist-parent=0"
"""The argument of a process whose starter exits at once by design (ipyparallel's ssh
receiver): it watches no parent (pid 0 names none)."""


def watch_parent(poll_s: float = 0.5, parent: int | None = None) -> threading.Thread | None:
    """Stop this process (and its children) once its parent process has died.

    Args:
        poll_s: Seconds between looks at the parent's pid.
        parent: The pid to outlive no longer (default: the one named by `--nbdist-parent=PID`
            in `sys.argv`, removed from it, else the current parent; `NO_PARENT_FLAG` names
            none). When this process's
            parent is already another one, that parent died before the watch began (e.g.
            Ctrl-C while the cluster was starting) and the process stops at once.

    Returns:
        The watching daemon thread, or None when there is no parent to watch (pid 1).
    """
    if parent is None:
        parent = _parent_from_argv()
    if parent is None:
        parent = os.getppid()
    if parent <= 1:
        return None
    thread = threading.Thread(
        target=_watch, args=(parent, poll_s), name="nbdist-parent-watch", daemon=True
    )
    thread.start()
    return thread


def _watch(parent: int, poll_s: float) -> None:
    # Polling: no portable notification tells a process that its parent has gone.
    while os.getppid() == parent:
        time.sleep(poll_s)
    stop_orphan()


def stop_orphan() -> None:
    """Stop this process as one whose starter is gone: its children by pid, then SIGTERM to
    itself (ipyparallel's handler), and exit with `ORPHAN_EXIT_CODE` if still here after the
    grace period (its main thread blocked in C). Called from a watching thread."""
    _stop_children()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(_GRACE_S)  # the main thread's handler stops the process within this, normally
    os._exit(ORPHAN_EXIT_CODE)


def _stop_children() -> None:
    """Terminate this process's descendants (by pid), then kill those still running."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # psutil missing: the children watch their own parents
        return
    for child in children:
        with contextlib.suppress(Exception):
            child.terminate()
    with contextlib.suppress(Exception):
        _, alive = psutil.wait_procs(children, timeout=_GRACE_S)
        for child in alive:
            with contextlib.suppress(Exception):
                child.kill()
