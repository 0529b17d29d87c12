"""`no_leftover_processes`: assert that a block of code leaves no child process behind.

Imports psutil when used, not on import.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["assert_processes_gone", "no_leftover_processes"]

_POLL_S = 0.05


def _describe(process: Any) -> str:
    try:
        command = " ".join(process.cmdline())
        if len(command) > 240:  # keep both the program and its last arguments (script paths)
            command = f"{command[:80]} … {command[-150:]}"
        return f"pid {process.pid} ({process.status()}): {command}"
    except Exception:  # the process went away or is unreadable while we looked
        return f"pid {process.pid}"


@contextlib.contextmanager
def no_leftover_processes(grace: float = 5.0) -> Iterator[None]:
    """Assert that the block leaves no new child process of ours behind (zombies included).

    Records our descendants before the block; afterwards, polls for up to `grace` seconds
    until every descendant started since is gone. If the block raises, that error propagates
    and nothing is checked. Works as a decorator too.

    Args:
        grace: Seconds new descendants get to exit after the block.

    Raises:
        AssertionError: Listing each leftover process's pid, status and command line.

    Example:
        >>> from nbdist.testing import run_workers
        >>> with no_leftover_processes():
        ...     _ = run_workers("pass", [{}])
    """
    import psutil

    me = psutil.Process()

    def descendants() -> dict[tuple[int, float], Any]:
        found = {}
        for process in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found[(process.pid, process.create_time())] = process
        return found

    before = set(descendants())
    yield
    deadline = time.monotonic() + grace
    while True:
        leftover = [p for key, p in descendants().items() if key not in before]
        if not leftover or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    if leftover:
        listing = "\n".join(_describe(process) for process in leftover)
        raise AssertionError(
            f"{len(leftover)} child process(es) outlived the block by {grace:g}s:\n{listing}\n"
            "Kill and wait for every process you start (run_workers does), or give it longer "
            "with no_leftover_processes(grace=...)."
        )


def assert_processes_gone(pids: tuple[int, ...], deadline_s: float = 15.0) -> None:
    """Assert every pid has exited (zombies of other parents count as exited) within the deadline.

    Example:
        >>> assert_processes_gone(())
    """
    import contextlib

    import psutil

    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))

    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    _, alive = psutil.wait_procs([p for p in processes if running(p)], timeout=deadline_s)
    alive = [p for p in alive if running(p)]
    assert not alive, f"processes left after stop(): {[(p.pid, p.cmdline()) for p in alive]}"
