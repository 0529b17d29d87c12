"""`HeartbeatWatch`: the notebook notices engines whose heartbeats stopped during a call.

Note [A host that drops off]: every engine publishes a heartbeat to the rendezvous store every
`HEARTBEAT_SECONDS` (`nbdist.collectives.liveness`). When a host drops off the network in the
middle of an all-reduce, its engines neither answer nor die: ipyparallel unregisters them only
after 10 s of missed controller beats, and the replicas on other hosts wait in gloo for peers
whose connections never close (no FIN or RST crosses a cut link) until the call's own timeout.
So while a call runs longer than `WATCH_AFTER_S`, a thread of the notebook reads every
engine's heartbeat from the store; an engine whose heartbeat has not changed for
`LOST_AFTER_S` is lost (when the store itself stops answering for that long, the engines on
its host, replica 0's, are). The supervisor then abandons the group (Note [Waking a blocked
collective] in `nbdist.collectives.abort`), which fails the other replicas' collectives within
a heartbeat, and ends the call with an error naming the lost replicas and their hosts.

A heartbeat comes from a thread of the engine's own, so an engine busy in Python, or blocked in
a collective or in C code that releases the GIL, keeps beating: only a lost host or a process
that is stopped or frozen whole goes quiet. One more does: code in the call that destroys the
process group (`dist.destroy_process_group()`, `strategy.shutdown()`) ends that engine's
heartbeat, so a call that goes on for `LOST_AFTER_S` after that is taken for a lost host.

Example (needs running engines, so not run here)::

    watch = HeartbeatWatch(("198.18.0.11", 29500, "nbdist/0/"), ranks=[0, 1, 2, 3])
    watch.start(); ...; watch.lost()   # {2: 'no heartbeat for 6.1 s', 3: ...}
    watch.stop()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

__all__ = ["LOST_AFTER_S", "WATCH_AFTER_S", "HeartbeatWatch"]

WATCH_AFTER_S = 1.0
"""Seconds a call runs before its engines' heartbeats are watched (quick calls pay nothing)."""
LOST_AFTER_S = 6.0
"""Seconds without a new heartbeat after which an engine counts as lost (12 heartbeats)."""
_POLL_S = 0.5
_STORE_TIMEOUT_S = 2.0


class HeartbeatWatch:
    """Reads the heartbeats of `ranks` from the store `(addr, port, prefix)` from a thread.

    Args:
        store: The rendezvous store's address, port and the group generation's key prefix.
        ranks: The replicas to watch.
        lost_after: Seconds without a new heartbeat that make a replica lost.
    """

    def __init__(
        self,
        store: tuple[str, int, str],
        ranks: Sequence[int],
        lost_after: float = LOST_AFTER_S,
    ) -> None:
        self._addr, self._port, self._prefix = store
        self._ranks = list(ranks)
        self._lost_after = lost_after
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[str | None, float]] = {}
        self._store_ok = time.monotonic()
        self._store_silent = False
        self._thread = threading.Thread(
            target=self._run, name="nbdist-heartbeat-watch", daemon=True
        )

    def start(self) -> None:
        """Begin watching (from now: a heartbeat must change within `lost_after`)."""
        now = time.monotonic()
        self._store_ok = now
        self._seen = {rank: (None, now) for rank in self._ranks}
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (it ends within a store timeout)."""
        self._stop.set()

    def lost(self) -> dict[int, str]:
        """`{replica: why}` for replicas lost so far (empty while all beat)."""
        now = time.monotonic()
        with self._lock:
            if self._store_silent:
                return {
                    rank: f"the rendezvous store on replica 0's host stopped answering "
                    f"{now - self._store_ok:.1f} s ago"
                    for rank in self._ranks
                }
            return {
                rank: f"no heartbeat for {now - since:.1f} s"
                for rank, (_, since) in self._seen.items()
                if now - since >= self._lost_after
            }

    def _run(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = self._connect()
                values = {rank: self._read(store, rank) for rank in self._ranks}
            except Exception:
                store = None  # unreachable: try again; silence counts from the last answer
                with self._lock:
                    self._store_silent = time.monotonic() - self._store_ok >= self._lost_after
            else:
                now = time.monotonic()
                with self._lock:
                    self._store_ok = now
                    self._store_silent = False
                    for rank, value in values.items():
                        before = self._seen[rank][0]
                        if value is not None and value != before:
                            self._seen[rank] = (value, now)
            self._stop.wait(_POLL_S)

    def _connect(self) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(
            self._addr, self._port, None, False, timedelta(seconds=_STORE_TIMEOUT_S),
            wait_for_workers=False,
        )  # fmt: skip

    def _read(self, store: Any, rank: int) -> str | None:
        key = f"{self._prefix}hb/{rank}"
        if not store.check([key]):
            return None
        with contextlib.suppress(UnicodeDecodeError):
            return store.get(key).decode()
        return None
