"""How fast each engine's host sends to the notebook: the dashboard's measure of a slow link.

Note [Slow links]: "who waited for whom" (`nbdist.telemetry.timeline.blame`) charges each wait
to the replica that arrived last at a collective. A host with a slow network link does not make
its replicas arrive last: every all-reduce between two hosts crosses that link both ways, so
it slows every replica's collective alike, and from inside the group a slow link on one host
looks the same as one on the other. The notebook's machine is the third party that tells them
apart. So, when the replicas run on more than one host, each explicit dashboard refresh asks
every idle engine, one after the other, for `PROBE_BYTES` bytes, `TRIES` times, and divides
them by the quickest round trip: bytes per second from that engine to the notebook (a lower
bound: the request's own round trip counts too, alike for every engine).
`nbdist.telemetry.timeline.slow_links` then names the replicas of a host whose rate is
`SLOW_LINK_RATIO` (3) times below the fastest host's. The notebook's own link slows every
engine alike, so it names nobody. The cost: `PROBE_BYTES` x `TRIES` per engine per explicit
refresh (0.7 s for an engine behind 100 Mbit/s), none with the replicas on one host.

Example (needs engines on two hosts)::

    from nbdist.cluster.links import link_rates
    link_rates(cluster)          # {rank: bytes per second}, e.g. {0: 3.1e8, 1: 1.2e7}
"""

from __future__ import annotations

import time
from typing import Any

from nbdist.cluster.engine_side.publisher import link_probe

__all__ = ["PROBE_BYTES", "TRIES", "link_rates"]

PROBE_BYTES = 4 << 20
"""Bytes each engine sends per try: 0.34 s at 100 Mbit/s, milliseconds on a fast link."""
TRIES = 2
"""Round trips per engine; the quickest counts (the others met a busy machine)."""


def link_rates(
    cluster: Any, nbytes: int = PROBE_BYTES, timeout: float = 10.0, tries: int = TRIES
) -> dict[int, float]:
    """Bytes per second from each idle, living engine to the notebook, by rank: `nbytes`
    over the quickest of `tries` round trips (an engine that does not answer within
    `timeout` is left out; Note [Slow links])."""
    client = cluster.client
    rates = {}
    deadline = time.monotonic() + timeout
    for row in cluster.status():
        if row.state != "alive":
            continue
        try:
            quickest = min(_round_trip(client[row.id], nbytes, deadline) for _ in range(tries))
        except Exception:  # a busy or dead engine: no measure this time
            continue
        rates[row.rank] = nbytes / max(quickest, 1e-6)
    return rates


def _round_trip(view: Any, nbytes: int, deadline: float) -> float:
    began = time.perf_counter()
    view.apply_async(link_probe, nbytes).get(timeout=max(0.1, deadline - time.monotonic()))
    return time.perf_counter() - began
