"""Keeping the engines' process group usable: releasing blocked peers and re-forming it.

Runs on the engine: the notebook's supervisor (`nbdist.cluster.supervisor`) calls `release_peers`
on an engine that finished while its peers still wait in a collective, and
`Cluster` calls `reform` on every engine once all are idle again. Sent by reference, so the
engine imports this module (the same nbdist on both sides).

Example (what the notebook does, through ipyparallel)::

    view.apply_async(health.release_peers, "replica 1 finished a %%distribute cell").get()
    view.apply_async(health.reform, "gen-2").get()      # {"ok": True, ...}
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from nbdist.cluster import _wire
from nbdist.cluster.engine_side import state

__all__ = ["group_prefix", "reform", "release_peers"]


def release_peers(who: str) -> dict[str, Any]:
    """Abandon the process group if peers wait in a collective this engine will not join.

    Called by the notebook on an engine that finished (or failed) its cell or function while
    others still run (Note [Releasing blocked peers] in `nbdist.cluster.supervisor`). `who` says
    what this engine did, e.g. "replica 1 finished a %%distribute cell". Peers that entered
    more collectives than this engine, or sit in a `torch.distributed` call of their own, wait
    for it in vain: the group is abandoned on every rank (Note [Waking a blocked collective] in
    `nbdist.collectives.abort`), which fails their call within a heartbeat with an error that
    names this replica; every engine keeps its Python state, and the notebook forms the group
    again once all are idle. Returns `{"waiting": [...], "left": bool}`.
    """
    group = state.group()
    if group is None or group.aborted is not None:
        return {"waiting": [], "left": False}
    waiting = group.peers_waiting()
    if not waiting:
        return {"waiting": [], "left": False}
    rank = state.rank()
    group.request_abort(
        f"{who} without entering the collective that replica(s) {waiting} wait in "
        f"(replica {rank} never arrived)",
        missing=[rank],
        secondary="failed" in who,
    )
    return {"waiting": waiting, "left": True}


def reform(generation: str) -> dict[str, Any]:
    """Form the engines' process group again under `generation` (all engines, all idle).

    The engine keeps its namespace and its `strategy` object; only the connections are new.
    SIGINT is ignored meanwhile: one arriving now was meant for the call just interrupted, and
    would break the rendezvous halfway (Note [Signal before abort] in `nbdist.cluster.supervisor`).
    """
    try:
        with _sigint_ignored():
            group = state.group()
            if group is not None:
                group.reform(generation)
    except BaseException as error:
        return _wire.failure(error, "re-forming the process group")
    return {"ok": True, "value": _wire.dumps(None), "elapsed": 0.0}


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT inside the block (main thread only: elsewhere it changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:  # None: the handler was not set from Python (then the default one)
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def group_prefix() -> str | None:
    """The current group generation's key prefix in the rendezvous store."""
    group = state.group()
    return None if group is None else group.prefix
