"""The engine's half of the dashboard feed: the records it publishes while a cell runs, and the
snapshot it returns when the notebook pulls one.

Runs on the engine: `joining.bootstrap` starts one publisher thread (`start_publisher`) that,
at most twice a second and only when something new was recorded, sends the newest records with
ipyparallel's data publication (a `data_message` on IOPub, attached to the request the engine
is running); and, while a request runs on after catching a `KeyboardInterrupt`, a note saying
which line it runs (`guards.interrupt_note`). `engine_snapshot` is sent by reference by
`nbdist.cluster.feed.pull` (so the engine imports this module: the same nbdist on both
sides). `nbdist.cluster.feed` is the notebook's half, which reads both.

Example (on an engine that joined the cluster)::

    from nbdist.cluster.engine_side.publisher import feed_message
    from nbdist.cluster.engine_side import state
    feed_message(state.strategy(), state.rank())["telemetry"]
"""

from __future__ import annotations

import time
from typing import Any

from nbdist.cluster.engine_side import state

__all__ = ["FEED_KEY", "engine_snapshot", "feed_message", "link_probe", "start_publisher"]

FEED_KEY = "nbdist_feed"
_PUBLISH_S = 0.5
"""At most one feed message per this many seconds."""
_LOOK_S = 0.1
"""How often the thread looks for new records: the first records after a quiet spell (a cell
starting) go out within this, not after a whole `_PUBLISH_S` (the dashboard's first chart)."""
_TAIL = 1_000  # newest records sent per message (a slower reader can miss older ones)
_publisher: dict[str, Any] = {"thread": None}


def engine_snapshot() -> dict[str, Any]:
    """This engine's records (runs on the engine)."""
    from nbdist.telemetry.holdings import holdings, memory_in_use
    from nbdist.telemetry.metrics import metric_log

    strategy = state.current_strategy()
    namespace = state.namespace_or_empty()
    telemetry = strategy.extended.telemetry.snapshot() if strategy is not None else {}
    device = str(strategy.extended.worker_devices[0]) if strategy is not None else "cpu"
    return {
        "rank": state.rank(),
        "telemetry": telemetry,
        "metrics": metric_log().records(),
        "metrics_appended": metric_log().appended,
        "holdings": holdings(namespace),
        "memory": memory_in_use(device),
        "time": time.time(),
    }


def link_probe(nbytes: int) -> bytes:
    """`nbytes` bytes for the notebook to time (runs on the engine: Note [Slow links] in
    `nbdist.cluster.links`).

    Example:
        >>> len(link_probe(4))
        4
    """
    return bytes(int(nbytes))


def feed_message(strategy: Any, rank: int) -> dict[str, Any]:
    """What one feed message carries: the newest records of `strategy`'s telemetry and of
    this process's metric log, the collectives in progress and the memory in use.

    Example:
        >>> import nbdist as nd
        >>> sorted(feed_message(nd.get_strategy(), 0))
        ['memory', 'metrics', 'metrics_appended', 'rank', 'telemetry', 'time']
    """
    from nbdist.telemetry.holdings import memory_in_use
    from nbdist.telemetry.metrics import metric_log

    log = metric_log()
    return {
        "rank": rank,
        "time": time.time(),
        "memory": memory_in_use(str(strategy.extended.worker_devices[0])),
        "telemetry": strategy.extended.telemetry.tail(_TAIL, _TAIL),
        "metrics": log.tail(_TAIL),
        "metrics_appended": log.appended,
    }


def _publish_once(last: tuple) -> tuple:
    from ipyparallel.datapub import publish_data

    from nbdist.telemetry.metrics import metric_log

    strategy = state.current_strategy()
    if strategy is None:
        return last
    now = (strategy.extended.telemetry.version, metric_log().version)
    if now == last:
        return last
    publish_data({FEED_KEY: feed_message(strategy, state.rank())})
    return now


def _publish_interrupt_note(last: str | None) -> str | None:
    """Publish `guards.interrupt_note()` for the running request when it changed: the
    notebook reads it to name a replica that caught the KeyboardInterrupt and runs on."""
    from ipyparallel.datapub import publish_data

    from nbdist.cluster.engine_side.guards import INTERRUPT_KEY, interrupt_note

    note = interrupt_note()
    if note is not None and note != last:
        publish_data({INTERRUPT_KEY: note})
    return note


def start_publisher() -> None:
    """Start this engine's publisher thread (once; runs on the engine)."""
    import threading

    if _publisher["thread"] is not None:
        return

    def loop() -> None:
        last: tuple = ()
        note: str | None = None
        sent = 0.0
        while True:
            time.sleep(_LOOK_S)  # a pace, not a synchronisation
            if time.monotonic() - sent < _PUBLISH_S:
                continue
            try:
                now = _publish_once(last)
                if now != last:
                    last, sent = now, time.monotonic()
                note = _publish_interrupt_note(note)
            except Exception:  # no kernel (plain process) or a closed socket: stay quiet
                time.sleep(5 * _PUBLISH_S)

    thread = threading.Thread(target=loop, name="nbdist-feed", daemon=True)
    _publisher["thread"] = thread
    thread.start()
