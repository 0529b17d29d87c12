"""`%dist debug [N]`: the debugger prompt in the frames of replica N's last failure.

Every engine keeps its last failure (`engine_side.debugger.remember_failure`); this sends
`engine_side.debugger.post_mortem` to replica N's engine through the engine-call path
(`supervise`), which shows the same prompt as `breakpoint()` in a cell (`(Pdb replica N) `,
Note [A debugger over a socket] in `nbdist.cluster.debug_prompt`), starting in the innermost
frame of the user's code, with the variables the failing line saw. `c` or `q` ends it.
Without N, the replica is the first that failed in the last `RemoteError` (the cause, not a
replica released because of it).

Example (in a notebook, after a cell failed on replica 1)::

    %dist debug        # (Pdb replica 1)
    %dist debug 0      # replica 0's last failure
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError

from nbdist.cluster.engine_side.debugger import post_mortem
from nbdist.cluster.supervisor import Call, supervise

__all__ = ["NO_FAILURE", "debug_command"]

NO_FAILURE = (
    "%dist debug: no failure to debug. It opens the debugger in the frames where the last "
    "%%distribute cell (or strategy.run) failed on a replica, and none has failed in this "
    "session. Run the failing cell first, then `%dist debug` (or `%dist debug N` for replica "
    "N's last failure); to stop in a cell that does not fail, put breakpoint() in it."
)
_CALL = Call(what="%dist debug", fix="`%dist restart`", subject="The debugger")


def debug_command(cluster: Any, words: list[str], last_error: Any = None) -> None:
    """`%dist debug [N]` (see the module docstring).

    Raises:
        UsageError: bad arguments, no running cluster, or no failure to debug.
    """
    from nbdist.cluster.errors import RemoteError

    if len(words) > 1 or (words and not words[0].isdigit()):
        raise UsageError(
            f"%dist debug takes at most one replica id, got {words}. Use: %dist debug [N]"
        )
    if cluster is None or not cluster.running:
        raise UsageError(
            "%dist debug opens the debugger on an engine, but no cluster is running: start one "
            "with `%dist start` (e.g. `%dist start -n 2`)."
        )
    error = getattr(sys, "last_value", None)
    if not isinstance(error, RemoteError):
        error = last_error if isinstance(last_error, RemoteError) else None
    if words:
        replica = int(words[0])
        if replica >= cluster.num_engines:
            raise UsageError(
                f"%dist debug {replica}: the cluster has replicas 0 to {cluster.num_engines - 1}."
            )
    elif error is None:
        raise UsageError(NO_FAILURE)
    else:
        first = (error.causes or error.failures)[0]
        replica = first.replica
        if first.ename == "EngineError":
            raise UsageError(
                f"%dist debug: replica {replica}'s engine died in the last failure, so its "
                "frames are gone; run `%dist restart`, and the cell again."
            )
    engine = next(info for info in cluster.engines if info.rank == replica)
    with cluster.turn("%dist debug", None):
        cluster.require_alive("%dist debug", fix="`%dist restart`")
        try:
            supervise(cluster, [engine], post_mortem, b"", call=_CALL, timeout=None)
        except RemoteError as failed:
            if [f.ename for f in failed.failures] == ["ContextError"]:
                raise UsageError(f"%dist debug: {failed.failures[0].evalue}") from None
            raise
