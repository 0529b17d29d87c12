"""Where a dashboard's numbers come from: one in-process strategy, or a cluster's engines.

`source_for(target)` picks the source; `source.collect()` returns one plain dict:
`engines` (rows), `collectives`/`steps` (telemetry tuples, wall-clock times), `aggregates`,
`metrics` (`(replica, step, name, value, wall)`), `holdings` and `memory` per replica,
`replica_check` (the newest replica check: `(wall, identical, message)` or None; Note [Replica
check]) and a `note` for the user.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from nbdist.holdings import holdings, memory_in_use
from nbdist.metrics import metric_log

__all__ = ["ClusterSource", "LocalSource", "source_for"]

_KEEP = 10_000  # records kept per engine from live updates


def _user_namespace() -> dict[str, Any]:
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    return dict(shell.user_ns) if shell is not None else {}


class LocalSource:
    """The replicas of one in-process strategy (threads of this kernel)."""

    in_process = True
    """The replicas run in this process (the refresher competes with them for the GIL)."""

    def __init__(self, strategy: Any, note: str = ""):
        self.strategy = strategy
        self.note = note
        self.namespace: dict | None = None  # None: the IPython user namespace

    def collect(self, in_thread: bool = False) -> dict[str, Any]:
        snap = self.strategy.extended.telemetry.snapshot()
        devices = [str(d) for d in self.strategy.extended.worker_devices]
        rows = holdings(_user_namespace() if self.namespace is None else self.namespace)
        memory = memory_in_use(devices[0] if devices else "cpu")
        engines = [
            {"replica": i, "state": "alive", "host": socket.gethostname(), "pid": os.getpid(),
             "device": d, "memory": memory, "heartbeat": time.time()}
            for i, d in enumerate(devices)
        ]  # fmt: skip
        return {
            "engines": engines,
            "collectives": snap["collectives"],
            "steps": snap["steps"],
            "pending": snap["pending"],
            "marks": {i: snap.get("marks", []) for i in range(len(devices))},
            "aggregates": snap["aggregates"],
            "metrics": metric_log().records(),
            "holdings": {0: rows},
            "memory": {0: memory},
            "replica_check": snap.get("replica_check"),
            "note": self.note,
        }


class ClusterSource:
    """A cluster's engines: their states every time, their records pulled between cells.

    ipyparallel's client is not thread-safe, so the refresher thread (`in_thread=True`) never
    touches it: it reads the engines' states from their processes (a dead pid is dead at
    once) and the cluster's own count of requests in flight; pulling records from the engines
    happens on the kernel's thread, after each cell and on `refresh()`.
    """

    in_process = False
    """The replicas run on engines, other processes."""

    def __init__(self, cluster: Any):
        self.cluster = cluster
        self._snapshots: dict[int, dict] = {}
        self._seen: dict[int, float] = {}
        self._registered: set[int] | None = None

    def _merge_live(self, feed: dict) -> None:
        """Append what a feed message has that the last snapshot of its engine lacks."""
        rank = feed["rank"]
        snap = self._snapshots.setdefault(
            rank,
            {"telemetry": {"collectives": [], "steps": [], "aggregates": {}, "appended": 0,
                           "steps_appended": 0},
             "metrics": [], "metrics_appended": 0, "holdings": [], "memory": None, "time": 0.0},
        )  # fmt: skip
        if feed["time"] <= snap["time"]:
            return
        tel, new = snap["telemetry"], feed["telemetry"]
        for key, count in (("collectives", "appended"), ("steps", "steps_appended")):
            fresh = new[count] - tel.get(count, 0)
            if fresh > 0:
                tel[key] = (tel[key] + new[key][-fresh:])[-_KEEP:]
                tel[count] = new[count]
        fresh = feed["metrics_appended"] - snap.get("metrics_appended", 0)
        if fresh > 0:
            snap["metrics"] = (snap["metrics"] + feed["metrics"][-fresh:])[-_KEEP:]
            snap["metrics_appended"] = feed["metrics_appended"]
        tel["pending"] = new.get("pending", [])
        tel["marks"] = new.get("marks", tel.get("marks", []))  # all of them: a short list
        tel["replica_check"] = new.get("replica_check", tel.get("replica_check"))
        snap["memory"] = feed["memory"]
        snap["time"] = feed["time"]
        self._seen[rank] = feed["time"]

    def _status(self, in_thread: bool) -> list[Any]:
        from nbdist.cluster.processes import pid_alive
        from nbdist.cluster.status import EngineStatus

        if not in_thread or self._registered is None:
            rows = list(self.cluster.status())
            self._registered = {row.id for row in rows if row.state != "dead"}
            return rows
        here = socket.gethostname()
        rows = []
        inflight = self.cluster.inflight()
        for info in self.cluster.engines:
            alive = info.id in self._registered and (info.host != here or pid_alive(info.pid))
            busy = bool(inflight.get(info.id))
            state = "dead" if not alive else "busy" if busy else "alive"
            rows.append(EngineStatus(info.rank, info.id, info.host, info.pid, info.device, state))
        return rows

    def collect(self, in_thread: bool = False) -> dict[str, Any]:
        from nbdist.cluster.feed import live_updates, pull

        status = self._status(in_thread)
        if not in_thread and any(row.state == "alive" for row in status):
            for rank, snap in pull(self.cluster, timeout=5.0).items():
                self._snapshots[rank] = snap
                self._seen[rank] = snap["time"]
        for feed in live_updates(self.cluster):
            self._merge_live(feed)
        engines = [
            {"replica": row.rank, "state": row.state, "host": row.host, "pid": row.pid,
             "device": row.device, "memory": self._snapshots.get(row.rank, {}).get("memory"),
             "heartbeat": self._seen.get(row.rank)}
            for row in status
        ]  # fmt: skip
        telemetry = [s["telemetry"] for s in self._snapshots.values()]
        collectives = _merge_collectives(_common_tails(telemetry, "collectives", "appended"))
        steps = sorted(
            (st for part in _common_tails(telemetry, "steps", "steps_appended") for st in part),
            key=lambda st: st[1],
        )
        aggregates: dict[str, dict] = {}
        for s in self._snapshots.values():
            aggregates.update(s["telemetry"].get("aggregates", {}))
        pending = _merge_pending(
            {r: s["telemetry"].get("pending", []) for r, s in self._snapshots.items()},
            sorted(row.rank for row in status),
        )
        dead = [row.rank for row in status if row.state == "dead"]
        note = f"Engine(s) of replica(s) {dead} are dead: `%dist restart`." if dead else ""
        return {
            "engines": engines,
            "collectives": collectives,
            "steps": steps,
            "pending": pending,
            "marks": {r: s["telemetry"].get("marks", []) for r, s in self._snapshots.items()},
            "aggregates": aggregates,
            "metrics": sorted(
                (m for s in self._snapshots.values() for m in s["metrics"]), key=lambda m: m[4]
            ),
            "holdings": {r: s["holdings"] for r, s in self._snapshots.items()},
            "memory": {r: s["memory"] for r, s in self._snapshots.items()},
            "replica_check": newest_check(
                [getattr(self.cluster, "last_replica_check", None)]
                + [s["telemetry"].get("replica_check") for s in self._snapshots.values()]
            ),
            "note": note,
        }


def newest_check(checks: list[Any]) -> tuple[float, bool, str] | None:
    """The newest of the replica checks given (None where none ran).

    Example:
        >>> newest_check([None, (1.0, True, ""), (2.0, False, "differ")])
        (2.0, False, 'differ')
    """
    found = [tuple(c) for c in checks if c]
    return max(found, key=lambda c: c[0]) if found else None


def _common_tails(telemetry: list[dict], key: str, count: str) -> list[list[tuple]]:
    """Each engine's `key` records up to the newest one that every engine has sent.

    The engines' feeds arrive at different moments, so one engine's newest records can be a
    few steps ahead of another's; `count` (records ever appended) numbers them the same on
    every engine, and cutting each list at the smallest count lines up the n-th record from
    the end on every engine (what `_merge_collectives` and `step_split` pair).

    Example:
        >>> _common_tails([{"c": [1, 2, 3], "n": 3}, {"c": [1, 2], "n": 2}], "c", "n")
        [[1, 2], [1, 2]]
    """
    parts = [(t.get(count, len(t.get(key, []))), t.get(key, [])) for t in telemetry]
    if not parts:
        return []
    newest = min(appended for appended, _ in parts)
    return [records[: max(len(records) - (appended - newest), 0)] for appended, records in parts]


def _merge_collectives(per_engine: list[list[tuple]]) -> list[tuple]:
    """Engines each record their own half of a collective `(rank,)` with its own duration;
    the n-th record of the same op on every engine is one collective. Merge them into one
    record with every replica's wait (the last to arrive waits 0)."""
    if len(per_engine) < 2:
        return list(per_engine[0]) if per_engine else []
    count = min(len(records) for records in per_engine)
    merged = []
    for parts in zip(*(records[-count:] for records in per_engine)):
        ends = [p[4] + p[5] for p in parts]
        arrivals = [p[4] for p in parts]
        last = max(arrivals)
        replicas = tuple(p[3][0] for p in parts)
        first = min(arrivals)
        merged.append(
            (parts[0][0], parts[0][1], parts[0][2], replicas, first, max(ends) - first,
             tuple(last - a for a in arrivals))
        )  # fmt: skip
    return merged


def _merge_pending(per_engine: dict[int, list[tuple]], ranks: list[int]) -> list[tuple]:
    """Engines each mark their own half of a collective in progress, numbered the same on
    every engine: one `(op, replicas, arrivals)` per number, with None for every engine that
    has not arrived at it.

    Example:
        >>> _merge_pending({0: [("all_reduce:SUM", (0,), (5.0,), 12)], 1: []}, [0, 1])
        [('all_reduce:SUM', (0, 1), (5.0, None))]
    """
    by_key: dict[Any, tuple[str, dict[int, float]]] = {}
    for rank, pending in per_engine.items():
        for op, replicas, arrivals, *rest in pending:
            key = rest[0] if rest and rest[0] is not None else ("local", rank, op)
            _, arrived = by_key.setdefault(key, (op, {}))
            for replica, when in zip(replicas, arrivals):
                if when is not None:
                    arrived[rank if len(replicas) == 1 else replica] = when
    return [
        (op, tuple(ranks), tuple(arrived.get(r) for r in ranks)) for op, arrived in by_key.values()
    ]


def source_for(target: Any = None) -> Any:
    """The running cluster (or `target`'s), else the given or current strategy."""
    if target is None:
        try:
            from nbdist.cluster.session import notebook_cluster

            cluster = notebook_cluster()
        except Exception:
            cluster = None
        if cluster is not None:
            return ClusterSource(cluster)
        from nbdist.strategies.current import get_strategy

        return LocalSource(
            get_strategy(),
            note="No engines are running: this shows the in-process strategy. Start engines "
            "with `%dist start -n 2` (or `nd.Cluster(n=2).start()`) to see them here.",
        )
    if hasattr(target, "status") and hasattr(target, "client"):
        return ClusterSource(target)
    if hasattr(target, "extended"):
        return LocalSource(target)
    from nbdist.errors import ArgumentTypeError

    raise ArgumentTypeError(
        f"nd.dashboard(target=...) takes a strategy or an nd.Cluster, got "
        f"{type(target).__name__}. Leave it out to show the running cluster or the current "
        "strategy."
    )
