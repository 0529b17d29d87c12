"""Who waited for whom: the straggler, compute vs communication, and a Chrome trace, computed
from telemetry records (`Telemetry.snapshot()` tuples). Pure Python; imports nothing from
Jupyter or matplotlib.

A collective record holds each replica's wait: the last replica to arrive waits 0 and every
other replica's wait is time spent on it. `blame` charges each wait to the last arrival, so
the straggler is the replica with the most blame.

Example:
    >>> records = [("all_reduce:SUM", 8, "local", (0, 1), 0.0, 0.06, (0.05, 0.0))]
    >>> blame(records)
    {0: 0.0, 1: 0.05}
    >>> straggler(records)
    1
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

__all__ = [
    "SLOW_LINK_RATIO", "STUCK_S", "blame", "chrome_trace", "slow_links", "step_split", "straggler",
    "stuck",
]  # fmt: skip

STUCK_S = 5.0
"""A collective whose first replica arrived longer ago than this is shown as stuck."""


def blame(collectives: Sequence[tuple], window: int | None = None) -> dict[int, float]:
    """Seconds the other replicas waited for each replica, over the last `window` records."""
    chosen = collectives if window is None else collectives[-window:]
    out: dict[int, float] = {}
    for _, _, _, replicas, _, _, waits in chosen:
        for replica in replicas:
            out.setdefault(replica, 0.0)
        if len(waits) > 1:
            last = replicas[min(range(len(waits)), key=waits.__getitem__)]
            out[last] += sum(waits)
    return out


def straggler(collectives: Sequence[tuple], window: int | None = None) -> int | None:
    """The replica the others waited for most (None when nobody waited)."""
    totals = blame(collectives, window)
    if not totals or max(totals.values()) <= 0:
        return None
    return max(totals, key=totals.__getitem__)


SLOW_LINK_RATIO = 3.0
"""A host whose link is this many times slower than the fastest host's is named."""


def slow_links(
    rates: Mapping[int, float], hosts: Mapping[int, str], ratio: float = SLOW_LINK_RATIO
) -> list[int]:
    """The replicas on hosts whose link to the notebook is `ratio` times slower than the
    fastest host's (Note [Slow links] in `nbdist.cluster.links`); a host's rate is its
    replicas' best. Empty with fewer than two hosts measured.

    Example:
        >>> slow_links({0: 3e8, 1: 2.9e8, 2: 1.2e7, 3: 1.1e7}, {0: "h1", 1: "h1", 2: "h2", 3: "h2"})
        [2, 3]
    """
    best: dict[str, float] = {}
    for replica, rate in rates.items():
        host = hosts.get(replica)
        if host is not None:
            best[host] = max(best.get(host, 0.0), rate)
    if len(best) < 2:
        return []
    fastest = max(best.values())
    slow = {host for host, rate in best.items() if rate * ratio < fastest}
    return sorted(r for r in rates if hosts.get(r) in slow)


def stuck(pending: Sequence[tuple], now: float, after: float = STUCK_S) -> list[dict]:
    """The collectives in progress (`(op, replicas, arrivals, ...)`, an arrival being a
    wall-clock time or None while that replica has not arrived) whose first arrival is `after`
    seconds old or more: `op`, `since`, `waited`, which replicas have `arrived` and are
    `missing`.

    Example:
        >>> stuck([("all_reduce:SUM", (0, 1), (10.0, None))], now=16.0)
        [{'op': 'all_reduce:SUM', 'since': 10.0, 'waited': 6.0, 'arrived': [0], 'missing': [1]}]
    """
    out = []
    for op, replicas, arrivals, *_ in pending:
        known = [a for a in arrivals if a is not None]
        if not known or now - min(known) < after:
            continue
        since = min(known)
        out.append(
            {"op": op, "since": since, "waited": now - since,
             "arrived": [r for r, a in zip(replicas, arrivals) if a is not None],
             "missing": [r for r, a in zip(replicas, arrivals) if a is None]}
        )  # fmt: skip
    return out


def step_split(steps: Sequence[tuple], collectives: Sequence[tuple]) -> list[tuple]:
    """Per step `(start, duration, communication_seconds)`: collective time inside the step
    (counted once per collective), the rest being compute.

    Example:
        >>> step_split([((0,), 0.0, 1.0)], [("x", 8, "local", (0,), 0.2, 0.3, (0.0,))])
        [(0.0, 1.0, 0.3)]

    One entry per training step, not per replica and step: engines each record their own
    steps (`(rank,)`), and the n-th step of every engine (counted from the newest) is one
    step, with the earliest start and the replicas' mean duration and communication.

        >>> steps = [((0,), 0.0, 1.0), ((1,), 0.1, 0.8), ((0,), 1.0, 1.0), ((1,), 1.0, 1.0)]
        >>> [(s, round(d, 2), c) for s, d, c in step_split(steps, [])]
        [(0.0, 0.9, 0.0), (1.0, 1.0, 0.0)]
    """
    groups: dict[tuple, list[tuple]] = {}
    for record in steps:
        groups.setdefault(tuple(record[0]), []).append(record)
    if len(groups) <= 1:
        return _split_one(steps, collectives)
    splits = [_split_one(group, collectives) for group in groups.values()]
    count = min(len(split) for split in splits)
    out = []
    for parts in zip(*(split[len(split) - count :] for split in splits)):
        n = len(parts)
        out.append(
            (min(p[0] for p in parts), sum(p[1] for p in parts) / n, sum(p[2] for p in parts) / n)
        )
    return out


def _split_one(steps: Sequence[tuple], collectives: Sequence[tuple]) -> list[tuple]:
    """`step_split` for the steps of one replica (or one group of replicas)."""
    ordered = sorted(collectives, key=lambda r: r[4])
    out = []
    j = 0
    for _, start, duration in sorted(steps, key=lambda s: s[1]):
        end = start + duration
        while j < len(ordered) and ordered[j][4] < start:
            j += 1
        comm = 0.0
        k = j
        while k < len(ordered) and ordered[k][4] <= end:
            comm += min(ordered[k][5], end - ordered[k][4])
            k += 1
        out.append((start, duration, min(comm, duration)))
    return out


def chrome_trace(
    collectives: Sequence[tuple], steps: Sequence[tuple], path: str | os.PathLike
) -> int:
    """Write the timeline in the Chrome/Perfetto trace format (one track per replica).

    Returns the number of events written.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "run.json")
        >>> chrome_trace([("all_gather", 8, "local", (0, 1), 1.0, 0.5, (0.1, 0.0))], [], path)
        2
    """
    events = []
    for op, nbytes, implementation, replicas, start, duration, waits in collectives:
        for replica, wait in zip(replicas, waits):
            arrival = start + (max(waits) - wait if len(waits) > 1 else 0.0)
            events.append(
                {
                    "name": op, "cat": "collective", "ph": "X", "pid": 0, "tid": replica,
                    "ts": arrival * 1e6, "dur": max(start + duration - arrival, 0.0) * 1e6,
                    "args": {"bytes": nbytes, "implementation": implementation, "wait_s": wait},
                }
            )  # fmt: skip
    for replicas, start, duration in steps:
        for replica in replicas:
            events.append(
                {"name": "step", "cat": "step", "ph": "X", "pid": 1, "tid": replica,
                 "ts": start * 1e6, "dur": duration * 1e6}
            )  # fmt: skip
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return len(events)
