"""The engines' telemetry, metrics, holdings and memory, brought to the notebook.

While a cell runs: every engine runs one publisher thread (`start_publisher`, from the
engine's bootstrap) that, at most twice a second and only when something new was recorded,
sends the newest records with ipyparallel's data publication (a `data_message` on IOPub,
attached to the request the engine is running). The notebook's ipyparallel client files it
under that request's `.data` on its own I/O thread; the dashboard reads it from there
(`live_updates`), so no request is sent per step and nobody waits for it.

`engine_snapshot()` runs on an engine (sent by `pull`): it returns plain tuples from the
engine strategy's telemetry, the process's metric log, what the engine's namespace holds per
device and its memory in use. `pull(cluster)` asks every idle, living engine for one in one
request each (never one per step) and returns what answered within the timeout; a busy or
dead engine keeps what was pulled from it last.

Example (needs engines):

    from nbdist.cluster.feed import pull
    data = pull(cluster)          # {rank: snapshot}
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["engine_snapshot", "feed_message", "live_updates", "pull", "start_publisher"]

FEED_KEY = "nbdist_feed"
_PUBLISH_S = 0.5
_TAIL = 1_000  # newest records sent per message (a slower reader can miss older ones)
_publisher: dict[str, Any] = {"thread": None}


def engine_snapshot() -> dict[str, Any]:
    """This engine's records (runs on the engine)."""
    from nbdist.cluster import _engine_side
    from nbdist.holdings import holdings, memory_in_use
    from nbdist.metrics import metric_log

    strategy = _engine_side._state["strategy"]
    namespace = _engine_side._state["namespace"] or {}
    telemetry = strategy.extended.telemetry.snapshot() if strategy is not None else {}
    device = str(strategy.extended.worker_devices[0]) if strategy is not None else "cpu"
    return {
        "rank": _engine_side._state["rank"],
        "telemetry": telemetry,
        "metrics": metric_log().records(),
        "metrics_appended": metric_log().appended,
        "holdings": holdings(namespace),
        "memory": memory_in_use(device),
        "time": time.time(),
    }


def pull(cluster: Any, timeout: float = 5.0) -> dict[int, dict[str, Any]]:
    """One snapshot per idle, living engine, by rank (engines that do not answer are left out)."""
    status = cluster.status()
    idle = [row for row in status if row.state == "alive"]
    if not idle:
        return {}
    client = cluster.client
    pending = {row.rank: client[row.id].apply_async(engine_snapshot) for row in idle}
    deadline = time.monotonic() + timeout
    out = {}
    for rank, result in pending.items():
        try:
            result.wait(max(0.0, deadline - time.monotonic()))
            if result.ready() and result.successful():
                out[rank] = result.get()
        except Exception:  # an engine that died while answering is shown dead by status()
            continue
    return out


def feed_message(strategy: Any, rank: int) -> dict[str, Any]:
    """What one feed message carries: the newest records of `strategy`'s telemetry and of
    this process's metric log, the collectives in progress and the memory in use.

    Example:
        >>> import nbdist as nd
        >>> sorted(feed_message(nd.get_strategy(), 0))
        ['memory', 'metrics', 'metrics_appended', 'rank', 'telemetry', 'time']
    """
    from nbdist.holdings import memory_in_use
    from nbdist.metrics import metric_log

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

    from nbdist.cluster import _engine_side
    from nbdist.metrics import metric_log

    strategy = _engine_side._state["strategy"]
    if strategy is None:
        return last
    now = (strategy.extended.telemetry.version, metric_log().version)
    if now == last:
        return last
    publish_data({FEED_KEY: feed_message(strategy, _engine_side._state["rank"])})
    return now


def start_publisher() -> None:
    """Start this engine's publisher thread (once; runs on the engine)."""
    import threading

    if _publisher["thread"] is not None:
        return

    def loop() -> None:
        last: tuple = ()
        while True:
            time.sleep(_PUBLISH_S)  # a pace, not a synchronisation
            try:
                last = _publish_once(last)
            except Exception:  # no kernel (plain process) or a closed socket: stay quiet
                time.sleep(5 * _PUBLISH_S)

    thread = threading.Thread(target=loop, name="nbdist-feed", daemon=True)
    _publisher["thread"] = thread
    thread.start()


def live_updates(cluster: Any) -> list[dict[str, Any]]:
    """The newest feed message of every request in flight (read-only; safe from any thread)."""
    client = cluster._client
    if client is None:
        return []
    out = []
    for requests in list(cluster._inflight.values()):
        for request in list(requests):
            for msg_id in list(getattr(request, "msg_ids", ())):
                md = client.metadata.get(msg_id)
                feed = md.get("data", {}).get(FEED_KEY) if md is not None else None
                if feed is not None:
                    out.append(feed)
    return out
