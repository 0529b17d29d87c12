"""Where a dashboard's numbers come from, and the one record every view draws from.

`source_for(target)` picks the source: `LocalSource` (one in-process strategy) or
`ClusterSource` (a cluster's engines). Both hand what each process recorded (its `Snapshot`:
the telemetry's `snapshot()`, the metric log, what its namespace holds, its memory) to one
builder, `build_data`, which lines several processes' records up and returns a `DashboardData`:
the engines (`EngineRow`), collectives, steps, collectives in progress, marks, metrics (the
named records of `nbdist.telemetry.records` and `nbdist.telemetry.metrics`, wall-clock times),
holdings and
memory per replica, the newest replica check (Note [Replica check]) and a note for the user.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nbdist.telemetry.holdings import holdings, memory_in_use
from nbdist.telemetry.metrics import MetricRecord, metric_log
from nbdist.telemetry.records import (
    CollectiveRecord,
    Mark,
    PendingCollective,
    ReplicaCheck,
    StepRecord,
)

__all__ = [
    "ClusterSource", "DashboardData", "EngineRow", "LocalSource", "Snapshot", "build_data",
    "newest_check", "source_for",
]  # fmt: skip

_KEEP = 10_000  # records kept per engine from live updates

Snapshot = Mapping[str, Any]
"""What one process sends (`nbdist.cluster.engine_side.publisher.engine_snapshot`): `telemetry`
(a `Telemetry.snapshot()`), `metrics` (`MetricRecord`s), `holdings` (rows), `memory` (bytes)."""


@dataclasses.dataclass(frozen=True)
class EngineRow:
    """One replica's process as the engines view shows it."""

    replica: int
    state: str
    """`"alive"`, `"busy"` or `"dead"`."""
    host: str
    pid: int
    device: str
    memory: int | None = None
    heartbeat: float | None = None
    """Wall-clock time its records were last heard of (None: never)."""


@dataclasses.dataclass
class DashboardData:
    """Everything a dashboard view draws, from one refresh (wall-clock times throughout).

    Example:
        >>> DashboardData().collectives, DashboardData().replica_check
        ([], None)
    """

    engines: list[EngineRow] = dataclasses.field(default_factory=list)
    collectives: list[CollectiveRecord] = dataclasses.field(default_factory=list)
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    pending: list[PendingCollective] = dataclasses.field(default_factory=list)
    marks: dict[int, list[Mark]] = dataclasses.field(default_factory=dict)
    aggregates: dict[str, dict] = dataclasses.field(default_factory=dict)
    """Per op, the records folded out of the logs (`count`, `nbytes`, `seconds`, ...)."""
    metrics: list[MetricRecord] = dataclasses.field(default_factory=list)
    holdings: dict[int, list[dict]] = dataclasses.field(default_factory=dict)
    memory: dict[int, int | None] = dataclasses.field(default_factory=dict)
    replica_check: ReplicaCheck | None = None
    note: str = ""
    size_history: list[Any] = dataclasses.field(default_factory=list)
    """A cluster's sizes (`SizeChange`s: the start, then each `%dist scale`), oldest first."""
    link_rates: dict[int, float] = dataclasses.field(default_factory=dict)
    """Bytes per second from each replica's engine to the notebook, measured on an explicit
    refresh when the replicas run on more than one host (Note [Slow links] in
    `nbdist.cluster.links`); empty otherwise."""

    def __getitem__(self, name: str) -> Any:
        """`data["metrics"]` reads `data.metrics` (code written when this was a dict)."""
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)


def build_data(
    engines: Sequence[EngineRow],
    snapshots: Mapping[int, Snapshot],
    *,
    ranks: Sequence[int] | None = None,
    marks: Mapping[int, list[Mark]] | None = None,
    checks: Sequence[Any] = (),
    note: str = "",
) -> DashboardData:
    """One `DashboardData` from every process's snapshot, by rank (one in-process strategy's
    snapshot under 0, or one per engine).

    Engines each record their own half of a collective and their own steps; their n-th
    records (counted from the newest every engine has sent) are paired into one. `ranks`
    are the replicas a collective in progress waits for (the engines' ranks by default);
    `marks` replaces the per-process marks (an in-process strategy's on every replica row);
    `checks` are replica checks made elsewhere (the notebook's), the newest of them and the
    snapshots' is shown.

    Example:
        >>> from nbdist.telemetry.records import Telemetry
        >>> t = Telemetry()
        >>> t.record("all_gather", 8, "local", (0, 1), 0.0, 0.5, (0.5, 0.0))
        >>> part = {"telemetry": t.snapshot(), "metrics": [], "holdings": [], "memory": None}
        >>> [r.op for r in build_data([], {0: part}).collectives]
        ['all_gather']
    """
    telemetry = [s["telemetry"] for s in snapshots.values()]
    collectives = _merge_collectives(_common_tails(telemetry, "collectives", "appended"))
    steps = [st for part in _common_tails(telemetry, "steps", "steps_appended") for st in part]
    metrics = [m for s in snapshots.values() for m in s["metrics"]]
    if len(snapshots) > 1:
        steps.sort(key=operator.itemgetter(1))
        metrics.sort(key=operator.itemgetter(4))
    aggregates: dict[str, dict] = {}
    for t in telemetry:
        aggregates.update(t.get("aggregates", {}))
    pending = _merge_pending(
        {r: s["telemetry"].get("pending", []) for r, s in snapshots.items()},
        sorted(ranks if ranks is not None else (e.replica for e in engines)),
    )
    return DashboardData(
        engines=list(engines),
        collectives=collectives,
        steps=steps,
        pending=pending,
        marks=dict(marks) if marks is not None
        else {r: s["telemetry"].get("marks", []) for r, s in snapshots.items()},
        aggregates=aggregates,
        metrics=metrics,
        holdings={r: s["holdings"] for r, s in snapshots.items()},
        memory={r: s["memory"] for r, s in snapshots.items()},
        replica_check=newest_check([*checks, *(t.get("replica_check") for t in telemetry)]),
        note=note,
    )


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

    def version(self) -> Any:
        """Changes whenever something new was recorded (cheap: the refresher asks often)."""
        return self.strategy.extended.telemetry.version, metric_log().version

    def collect(self, in_thread: bool = False) -> DashboardData:
        snap = self.strategy.extended.telemetry.snapshot()
        devices = [str(d) for d in self.strategy.extended.worker_devices]
        memory = memory_in_use(devices[0] if devices else "cpu")
        part = {
            "telemetry": snap,
            "metrics": metric_log().records(),
            "holdings": holdings(_user_namespace() if self.namespace is None else self.namespace),
            "memory": memory,
        }
        engines = [
            EngineRow(i, "alive", socket.gethostname(), os.getpid(), d, memory, time.time())
            for i, d in enumerate(devices)
        ]
        return build_data(
            engines, {0: part}, marks={e.replica: snap.get("marks", []) for e in engines},
            note=self.note,
        )  # fmt: skip


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

    def version(self) -> Any:
        """Changes whenever an engine sent new records or a request started or ended (cheap:
        the refresher asks often; safe from any thread)."""
        from nbdist.cluster.feed import live_updates

        times = tuple(sorted((f["rank"], f["time"]) for f in live_updates(self.cluster)))
        return times, sum(len(r) for r in self.cluster.inflight().values())

    def _status(self, in_thread: bool) -> list[Any]:
        from nbdist.cluster.launch.processes import pid_alive
        from nbdist.cluster.status import EngineStatus

        resized = len(getattr(self.cluster, "size_history", ()))
        if resized != getattr(self, "_sizes_seen", resized):  # `%dist scale`: new engines
            self._registered = None
            ranks = {info.rank for info in self.cluster.engines}
            for rank in [r for r in self._snapshots if r not in ranks]:
                self._snapshots.pop(rank, None)
                self._seen.pop(rank, None)
        self._sizes_seen = resized
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

    def collect(self, in_thread: bool = False) -> DashboardData:
        from nbdist.cluster.feed import live_updates, pull

        status = self._status(in_thread)
        if not in_thread and any(row.state == "alive" for row in status):
            for rank, snap in pull(self.cluster, timeout=5.0).items():
                self._snapshots[rank] = snap
                self._seen[rank] = snap["time"]
        for feed in live_updates(self.cluster):
            self._merge_live(feed)
        engines = [
            EngineRow(row.rank, row.state, row.host, row.pid, row.device,
                      self._snapshots.get(row.rank, {}).get("memory"), self._seen.get(row.rank))
            for row in status
        ]  # fmt: skip
        dead = [row.rank for row in status if row.state == "dead"]
        data = build_data(
            engines, self._snapshots,
            checks=[getattr(self.cluster, "last_replica_check", None)],
            note=f"Engine(s) of replica(s) {dead} are dead: `%dist restart`, or `%dist scale "
            "--survivors` to go on without them." if dead else "",
        )  # fmt: skip
        data.size_history = list(getattr(self.cluster, "size_history", ()))
        if not in_thread and len({row.host for row in engines}) > 1:
            from nbdist.cluster.links import link_rates

            data.link_rates = link_rates(self.cluster)  # Note [Slow links]
        return data


def newest_check(checks: Sequence[Any]) -> ReplicaCheck | None:
    """The newest of the replica checks given (None where none ran).

    Example:
        >>> newest_check([None, (1.0, True, ""), (2.0, False, "differ")])
        ReplicaCheck(at=2.0, identical=False, message='differ')
    """
    found = [ReplicaCheck(*c) for c in checks if c]
    return max(found, key=lambda c: c.at) if found else None


def _common_tails(telemetry: list[Mapping], key: str, count: str) -> list[list]:
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


def _merge_collectives(per_engine: list[list[CollectiveRecord]]) -> list[CollectiveRecord]:
    """Engines each record their own half of a collective `(rank,)` with its own duration;
    the n-th record of the same op on every engine is one collective. Merge them into one
    record with every replica's wait (the last to arrive waits 0)."""
    if len(per_engine) < 2:
        return list(per_engine[0]) if per_engine else []
    count = min(len(records) for records in per_engine)
    merged = []
    for parts in zip(*(records[-count:] for records in per_engine)):
        arrivals = [p.start for p in parts]
        first, last = min(arrivals), max(arrivals)
        merged.append(CollectiveRecord(
            parts[0].op, parts[0].nbytes, parts[0].implementation,
            tuple(p.replicas[0] for p in parts), first,
            max(p.start + p.duration for p in parts) - first, tuple(last - a for a in arrivals),
        ))  # fmt: skip
    return merged


def _merge_pending(
    per_engine: Mapping[int, Sequence[PendingCollective]], ranks: list[int]
) -> list[PendingCollective]:
    """Engines each mark their own half of a collective in progress, numbered the same on
    every engine: one record per number, with None for every replica that has not arrived.

    Example:
        >>> _merge_pending({0: [("all_reduce:SUM", (0,), (5.0,), 12)], 1: []}, [0, 1])
        [PendingCollective(op='all_reduce:SUM', replicas=(0, 1), arrivals=(5.0, None), key=12)]
    """
    by_key: dict[Any, tuple[str, dict[int, float]]] = {}
    for rank, pending in per_engine.items():
        for i, (op, replicas, arrivals, *rest) in enumerate(pending):
            key = rest[0] if rest and rest[0] is not None else ("local", rank, i)
            _, arrived = by_key.setdefault(key, (op, {}))
            for replica, when in zip(replicas, arrivals):
                if when is not None:
                    arrived[rank if len(replicas) == 1 else replica] = when
    return [
        PendingCollective(op, tuple(ranks), tuple(arrived.get(r) for r in ranks),
                          key if isinstance(key, int) else None)
        for key, (op, arrived) in by_key.items()
    ]  # fmt: skip


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
