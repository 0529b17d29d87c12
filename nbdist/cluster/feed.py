"""The engines' telemetry, metrics, holdings and memory, brought to the notebook.

This is the notebook's half; the engine's half is `nbdist.cluster.engine_side.publisher`.
While a cell runs, every engine's publisher thread sends the newest records with ipyparallel's
data publication (a `data_message` on IOPub, attached to the request the engine is running).
The notebook's ipyparallel client files it under that request's `.data` on its own I/O
thread; the dashboard reads it from there (`live_updates`), so no request is sent per step and
nobody waits for it.

`pull(cluster)` sends `engine_snapshot` to every idle, living engine, one request each (never
one per step): plain tuples from the engine strategy's telemetry, the process's metric log,
what the engine's namespace holds per device and its memory in use. It returns what answered
within the timeout; a busy or dead engine keeps what was pulled from it last.

Example (needs engines):

    from nbdist.cluster.feed import pull
    data = pull(cluster)          # {rank: snapshot}
"""

from __future__ import annotations

import time
from typing import Any

from nbdist.cluster.engine_side.publisher import FEED_KEY, engine_snapshot

__all__ = ["live_updates", "pull"]


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


def live_updates(cluster: Any) -> list[dict[str, Any]]:
    """The newest feed message of every request in flight (read-only; safe from any thread)."""
    client = cluster.connected_client
    if client is None:
        return []
    out = []
    for requests in cluster.inflight().values():
        for request in requests:
            for msg_id in list(getattr(request, "msg_ids", ())):
                md = client.metadata.get(msg_id)
                feed = md.get("data", {}).get(FEED_KEY) if md is not None else None
                if feed is not None:
                    out.append(feed)
    return out
