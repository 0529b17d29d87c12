"""What a cell must not do to its engine, and what the notebook must learn from a busy one.

Runs on the engine. Three guards:

- `refuse_exit`: `exit()` and `quit()` in a cell (IPython's exiter calls `shell.ask_exit()`)
  would make ipykernel stop the engine's event loop ~0.1 s after the cell returned: the cell
  "succeeded", the engine died, its state was lost and the *next* cell was blamed. On an
  engine they raise `ContextError` instead, in the cell that called them, naming `%dist stop`
  (`sys.exit()` raises `SystemExit`, which the cell reports as any error; the engine lives).
- `watched_call`: while a call from the notebook runs (`strategy.run`, `run_steps`, a
  `%%distribute` cell), SIGINT raises `KeyboardInterrupt` as usual, but also records where it
  struck. If the call is still running afterwards, the user's code caught the
  `KeyboardInterrupt` and went on: `interrupt_note` then says so, with the line it is running
  now, and the engine's publisher thread sends that note to the notebook (which cannot ask a
  busy engine: requests queue behind the running one). The notebook names it precisely
  instead of calling the replica "blocked outside Python" (Note [Cluster health] in
  `nbdist.cluster.supervisor`).

- `group_destroyed`: a cell that called `dist.destroy_process_group()` leaves the engines
  without the group their strategy created; every reply says so (`noting_the_group`), and the
  notebook forms it again at once, saying so, instead of letting the next collective fail
  with torch's "Default process group has not been initialized".

`running()` also tells the engine's SIGTERM handler (`nbdist.cluster.launch._engine_main`) that the
main thread is busy in user code, so a stop exits at once instead of waiting for a call that
may not return soon (ipyparallel would kill the engine only 5 s later).

Example (on an engine, inside a call)::

    with watched_call():
        run_the_users_code()
    interrupt_note()     # None, or "caught the KeyboardInterrupt ... still running line 5 (...)"
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from nbdist.errors import ContextError

__all__ = [
    "GROUP_DESTROYED",
    "INTERRUPT_KEY",
    "group_destroyed",
    "interrupt_note",
    "noting_the_group",
    "refuse_exit",
    "running",
    "watched_call",
]

INTERRUPT_KEY = "nbdist_interrupt"
"""The key of the interrupt note in the data the engine publishes for the running request."""

EXIT_REFUSED = (
    "exit() and quit() are refused on the engines: they would stop this engine (replica "
    "{rank}) a moment after the cell, losing its variables and leaving the other replicas "
    "without it. To stop every engine, run `%dist stop` (or cluster.stop()) in the notebook; "
    "to end a cell early, raise an exception (or return from a function)."
)

GROUP_DESTROYED = (
    "torch.distributed's default process group on this engine was destroyed "
    "(dist.destroy_process_group() in this or an earlier cell), so this collective could not "
    "run. nbdist forms the group again after this call, keeping the engines' variables: run "
    "it again. To stop the engines, use `%dist stop` (cluster.stop()) instead of destroying "
    "their group."
)

_call: dict[str, Any] = {"depth": 0, "interrupted": None}


def group_destroyed() -> bool:
    """True when user code destroyed the process group this engine's strategy created
    (`dist.destroy_process_group()`); the notebook then forms it again on every engine."""
    from nbdist.cluster.engine_side import state

    group = state.group()
    return bool(getattr(group, "destroyed_elsewhere", False))


def noting_the_group(reply: dict[str, Any]) -> dict[str, Any]:
    """`reply`, with `"group_destroyed": True` added when `group_destroyed()`."""
    if group_destroyed():
        reply["group_destroyed"] = True
    return reply


def refuse_exit(shell: Any) -> None:
    """Make `exit()`/`quit()` (and `get_ipython().ask_exit()`) raise `ContextError` on this
    engine's IPython `shell` instead of stopping the engine after the cell."""
    if shell is None:
        return

    shell.ask_exit = _RefusedExit("exit")
    for name in ("exit", "quit"):
        if name in shell.user_ns:
            shell.user_ns[name] = _RefusedExit(name)


class _RefusedExit:
    """`exit`/`quit` in an engine's namespace: calling it raises `ContextError` (its frame is
    nbdist's, so the user's traceback ends at the cell's line)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"{self.name}() is refused on the engines; stop them with `%dist stop`."

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        from nbdist.cluster.engine_side import state

        rank = state.rank()
        raise ContextError(EXIT_REFUSED.format(rank="?" if rank is None else rank))


def running() -> bool:
    """True while a call from the notebook runs on this engine's main thread."""
    return _call["depth"] > 0


@contextlib.contextmanager
def watched_call() -> Iterator[None]:
    """Run a call from the notebook with SIGINT noted (see the module's docstring).

    Outside the main thread (no signals there) it only counts the call as running.
    """
    outermost = _call["depth"] == 0
    _call["depth"] += 1
    previous = None
    main = threading.current_thread() is threading.main_thread()
    if outermost:
        _call["interrupted"] = None
        if main:
            previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        if outermost:  # breakpoint() opens the notebook's prompt (engine_side.debugger)
            from nbdist.cluster.engine_side.debugger import breakpoints

            with breakpoints():
                yield
        else:
            yield
    finally:
        _call["depth"] -= 1
        if outermost:
            _call["interrupted"] = None
            if main:
                signal.signal(
                    signal.SIGINT, signal.default_int_handler if previous is None else previous
                )


def _on_sigint(signum: int, frame: Any) -> None:
    """SIGINT during a call: note where it struck, then raise `KeyboardInterrupt` as usual."""
    _call["interrupted"] = (time.time(), _user_line(frame))
    raise KeyboardInterrupt


def interrupt_note() -> str | None:
    """None, unless SIGINT struck the running call and the call still runs (its code caught
    the `KeyboardInterrupt`): then what it runs now, e.g. `"caught the KeyboardInterrupt
    (raised at line 3 (time.sleep(60))) and is still running line 6 (total += 1)"`."""
    interrupted = _call["interrupted"]
    if interrupted is None or _call["depth"] == 0:
        return None
    from nbdist._private_api import thread_frames

    _, raised = interrupted
    now = _user_line(thread_frames().get(threading.main_thread().ident))
    at = f" (raised at {raised})" if raised else ""
    return f"caught the KeyboardInterrupt{at} and is still running" + (f" {now}" if now else "")


def _user_line(frame: Any) -> str:
    """`"line 6 (total += 1)"` (with the file unless it is a cell) for the innermost frame of
    the user's code in `frame`'s stack; "" when there is none."""
    import linecache

    from nbdist.cluster import _wire

    libraries = (os.path.dirname(os.__file__) + os.sep, f"{os.sep}site-packages{os.sep}")
    first_outside = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _wire.is_internal(filename):
            first_outside = first_outside or frame
            if not any(part in filename for part in libraries):
                break
        frame = frame.f_back
    frame = frame or first_outside
    if frame is None:
        return ""
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    source = linecache.getline(filename, lineno).strip()
    cell = filename.startswith("<") or os.path.basename(os.path.dirname(filename)).startswith(
        "ipykernel_"
    )
    place = f"line {lineno}" if cell else f"{os.path.basename(filename)} line {lineno}"
    return (
        place
        + (f" ({source[:60]})" if source else "")
        + ("" if frame.f_code.co_name == "<module>" else f" in {frame.f_code.co_name}()")
    )
