"""`nd.breakpoint(replica=None)`: stop in the debugger here, on one replica or on every one.

On an engine, during a call from the notebook (a `%%distribute` cell, `strategy.run`), the
replica stops and the notebook shows its prompt (`nbdist.cluster.engine_side.debugger`; plain
`breakpoint()` does the same there). Elsewhere (a script under torchrun, a plain process) it is
pdb on this process's terminal, as `torch.distributed.breakpoint(rank)` is; with no terminal
(stdin not a TTY, as for the workers of most launchers) it raises `ContextError` naming the
fix instead of hanging on input that never comes.

Example:
    >>> import nbdist as nd
    >>> nd.breakpoint(replica=3)   # this is replica 0: it does not stop
"""

from __future__ import annotations

import inspect
import sys

from nbdist.errors import ArgumentTypeError, ContextError

__all__ = ["breakpoint"]


def breakpoint(replica: int | None = None) -> None:
    """Stop the calling replica in the debugger (only replica `replica` when given).

    Args:
        replica: The replica id that stops; None: every replica that reaches the call.

    Raises:
        ArgumentTypeError: `replica` is not an int or None.
        ContextError: no notebook is attached and this process has no terminal.
    """
    if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int)):
        raise ArgumentTypeError(
            f"nd.breakpoint(replica=...) takes a replica id (int) or None, got "
            f"{type(replica).__name__} {replica!r}; e.g. nd.breakpoint(replica=1)."
        )
    from nbdist.telemetry.metrics import _current_replica

    mine = _current_replica()
    if replica is not None and mine != replica:
        return
    caller = inspect.currentframe()
    frame = caller.f_back if caller is not None else None
    stop_here = getattr(sys.breakpointhook, "stop_here", None)
    if stop_here is not None:  # an engine, in a call from the notebook
        stop_here(frame, "nd.breakpoint()")
        return
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        raise ContextError(
            f"nd.breakpoint() on replica {mine}: no notebook is attached and this process has "
            "no terminal to read debugger commands from (stdin is not a TTY). Run the code in "
            "a %%distribute cell (or strategy.run from the notebook) to get the prompt in the "
            "notebook, or run a single process in a terminal; under torchrun, use "
            "torch.distributed.breakpoint(rank) with a terminal attached."
        )
    import pdb

    pdb.Pdb().set_trace(frame)
