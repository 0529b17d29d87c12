"""The engines' telemetry, metrics, holdings and memory, brought to the notebook.

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

__all__ = ["engine_snapshot", "pull"]


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
