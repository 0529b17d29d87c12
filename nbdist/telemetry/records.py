"""A bounded in-memory record of every collective and step, written by the strategies, read by
dashboards.

Recording appends one plain tuple to a `deque`; the named records (`CollectiveRecord`,
`StepRecord`, `PendingCollective`, `Mark`, `ReplicaCheck`: NamedTuples, so they pickle small and
still unpack by position) are built only when read, so recording stays well under 2 % of a
4 KiB all-reduce. When the log is full, the oldest record
is folded into a per-op aggregate (count, bytes, total time, a log2 histogram of durations)
instead of being lost, so memory stays bounded however long training runs. `snapshot()`
turns everything into those records (for sending from engines to the notebook); its times are
wall-clock seconds so that several processes' records line up. Imports nothing from nbdist.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from collections.abc import Hashable, MutableSequence, Sequence
from typing import NamedTuple

__all__ = [
    "HISTOGRAM_BINS", "CollectiveRecord", "Mark", "OpAggregate", "PendingCollective",
    "ReplicaCheck", "StepRecord", "Telemetry", "now",
]  # fmt: skip

HISTOGRAM_BINS = 32
"""Duration histogram bins: bin k holds durations in [2**k, 2**(k+1)) microseconds."""


_MARKS = 256  # marks kept (cell starts): a few per cell, never in a hot path


class CollectiveRecord(NamedTuple):
    """What one collective did.

    `start` is `time.perf_counter()` in `Telemetry.records()`, wall-clock seconds in
    `snapshot()`/`tail()` and in the dashboard's data (several processes' records line up).

    Attributes:
        op: The collective (`"all_reduce:SUM"`, `"all_gather"`, `"merge_call"`, ...).
        nbytes: Bytes each replica contributed.
        implementation: How it ran (`"local"`, `"gloo"`, `"nccl"`, a CrossDeviceOps name).
        replicas: The replica ids taking part.
        start: When the first replica arrived.
        duration: Seconds from the first arrival to the result being ready.
        waits: Seconds each replica waited for the others (the last to arrive waits 0):
            a straggler shows as the replica whose wait is smallest while others' are large.
    """

    op: str
    nbytes: int
    implementation: str
    replicas: tuple[int, ...]
    start: float
    duration: float
    waits: tuple[float, ...]

    @property
    def bandwidth(self) -> float:
        """Bytes per second through the collective (0 when it took no measurable time)."""
        return self.nbytes / self.duration if self.duration > 0 else 0.0


class StepRecord(NamedTuple):
    """One `strategy.run` call: which replicas ran, when it started and how long it took.

    A step's communication time is the collectives' time inside it; the rest is compute.
    """

    replicas: tuple[int, ...]
    start: float
    duration: float


class PendingCollective(NamedTuple):
    """A collective in progress: one arrival per replica (wall-clock seconds, None while that
    replica has not arrived); `key` numbers it the same on every process of a group (None
    when the notebook merged several processes' halves, or for a local collective)."""

    op: str
    replicas: tuple[int, ...]
    arrivals: tuple[float | None, ...]
    key: int | None = None


class Mark(NamedTuple):
    """A moment noted on a process's timeline (`Telemetry.mark`), wall-clock seconds."""

    at: float
    label: str


class ReplicaCheck(NamedTuple):
    """The outcome of a replica check (Note [Replica check]): when, whether the replicas'
    parameters were identical, and the message naming those that differ."""

    at: float
    identical: bool
    message: str = ""


@dataclasses.dataclass
class OpAggregate:
    """Everything known about one op's records that were folded out of the log.

    Attributes:
        count: Records folded.
        nbytes: Their bytes, summed.
        seconds: Their durations, summed.
        histogram: Counts per duration bin (`HISTOGRAM_BINS`, log2 of microseconds).
    """

    count: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    histogram: list[int] = dataclasses.field(default_factory=lambda: [0] * HISTOGRAM_BINS)

    def add(self, nbytes: int, duration: float) -> None:
        """Fold one record in."""
        self.count += 1
        self.nbytes += nbytes
        self.seconds += duration
        micro = int(duration * 1e6)
        self.histogram[min(max(micro.bit_length() - 1, 0), HISTOGRAM_BINS - 1)] += 1


class Telemetry:
    """A bounded log of `CollectiveRecord`s and `StepRecord`s (the oldest collectives are
    folded into per-op `aggregates`, the oldest steps dropped).

    Example:
        >>> t = Telemetry(capacity=2)
        >>> t.record("all_reduce:SUM", 16, "local", (0, 1), 0.0, 0.5, (0.5, 0.0))
        >>> t.records()[0].bandwidth
        32.0
    """

    def __init__(self, capacity: int = 10_000, *, enabled: bool = True):
        self._log: collections.deque[tuple] = collections.deque(maxlen=capacity)
        self._steps: collections.deque[tuple] = collections.deque(maxlen=capacity)
        self._capacity = capacity
        self._offset = time.time() - time.perf_counter()  # fixed, so snapshots compare equal
        self.aggregates: dict[str, OpAggregate] = {}
        self.enabled = enabled
        self.version = 0
        """Grows with every record (readers redraw only when it changed)."""
        self.appended = 0
        """Collective records ever appended (to send only the new ones)."""
        self.steps_appended = 0
        """Step records ever appended."""
        self._pending: dict[Hashable, tuple] = {}
        self._marks: collections.deque[tuple[float, str]] = collections.deque(maxlen=_MARKS)
        self.replica_check: ReplicaCheck | None = None
        """The newest replica check, if any."""

    def _make_room(self) -> None:
        if len(self._log) == self._capacity:
            # Read the raw tuple (no CollectiveRecord built): this runs on every record once
            # the log is full, inside the collective's hot path.
            entry = self._log[0]
            op = entry[0]
            duration = entry[5] if len(entry) == 7 else entry[5] - min(entry[4])
            aggregate = self.aggregates.get(op)
            if aggregate is None:
                aggregate = self.aggregates[op] = OpAggregate()
            aggregate.add(entry[1], duration)

    def record(
        self,
        op: str,
        nbytes: int,
        implementation: str,
        replicas: tuple[int, ...],
        start: float,
        duration: float,
        waits: Sequence[float],
    ) -> None:
        """Append one record (does nothing while `enabled` is False)."""
        if self.enabled:
            if len(self._log) == self._capacity:
                self._make_room()
            self._log.append((op, nbytes, implementation, replicas, start, duration, waits))
            self.version += 1
            self.appended += 1

    def record_arrivals(
        self,
        op: str,
        nbytes: int,
        implementation: str,
        replicas: tuple[int, ...],
        arrivals: Sequence[float],
        ready: float,
    ) -> None:
        """Append a record from raw arrival times; start, duration and waits are derived on
        read, which keeps the hot path to one append."""
        if self.enabled:
            if len(self._log) == self._capacity:
                self._make_room()
            self._log.append((op, nbytes, implementation, replicas, arrivals, ready))
            self.version += 1
            self.appended += 1

    def begin(
        self,
        key: Hashable,
        op: str,
        replicas: tuple[int, ...],
        arrivals: MutableSequence[float | None],
    ) -> None:
        """Mark a collective as in progress until `end(key)` (what the dashboard's stuck view
        reads). `arrivals` has one entry per replica: its `now()` when it arrived, None until
        then; the caller fills it in as replicas arrive (it is read, never copied, here).
        Costs one dict store: it runs on every collective.

        Example:
            >>> t = Telemetry()
            >>> t.begin(7, "all_reduce:SUM", (0, 1), [now(), None])
            >>> [(p.op, p.arrivals[1], p.key) for p in t.in_flight()]
            [('all_reduce:SUM', None, 7)]
            >>> t.end(7); t.in_flight()
            []
        """
        if self.enabled:
            self._pending[key] = (op, replicas, arrivals)
            self.version += 1

    def end(self, key: Hashable) -> None:
        """The collective `begin(key, ...)` marked is over (finished or failed)."""
        if self._pending.pop(key, None) is not None:
            self.version += 1

    def in_flight(self) -> list[PendingCollective]:
        """The collectives in progress as `(op, replicas, arrivals, key)`, arrivals in
        wall-clock seconds (None: that replica has not arrived yet); `key` is `begin`'s when it
        is an int (the collective's number in a process group, the same on every process, so
        the notebook can line several processes' halves up), else None."""
        offset = self._offset
        return [
            PendingCollective(
                op, tuple(replicas), tuple(None if a is None else a + offset for a in arrivals),
                key if isinstance(key, int) else None,
            )
            for key, (op, replicas, arrivals) in tuple(self._pending.items())
        ]  # fmt: skip

    def mark(self, label: str) -> None:
        """Note a moment on this process's timeline, e.g. a notebook cell starting on an
        engine (the dashboard draws it on the replica's row). The newest `_MARKS` are kept.

        Example:
            >>> t = Telemetry()
            >>> t.mark("cell 3")
            >>> [label for _, label in t.snapshot()["marks"]]
            ['cell 3']
        """
        if self.enabled:
            self._marks.append((time.perf_counter(), label))
            self.version += 1

    def note_replica_check(self, identical: bool, message: str = "") -> None:
        """Record the outcome of a replica check (the dashboard flags replicas that diverge).

        Example:
            >>> t = Telemetry()
            >>> t.note_replica_check(False, "replicas differ")
            >>> t.snapshot()["replica_check"][1:]
            (False, 'replicas differ')
        """
        self.replica_check = ReplicaCheck(time.time(), identical, message)
        self.version += 1

    def _marks_wall_clock(self) -> list[Mark]:
        offset = self._offset
        return [Mark(at + offset, label) for at, label in list(self._marks)]

    def record_step(self, replicas: tuple[int, ...], start: float, duration: float) -> None:
        """Append one step (`strategy.run`) record.

        Example:
            >>> t = Telemetry()
            >>> t.record_step((0, 1), 1.0, 0.25)
            >>> t.steps()[0].duration
            0.25
        """
        if self.enabled:
            self._steps.append((replicas, start, duration))
            self.version += 1
            self.steps_appended += 1

    def steps(self) -> list[StepRecord]:
        """The step records kept, oldest first."""
        return [StepRecord(*entry) for entry in list(self._steps)]

    def tail(self, collectives: int, steps: int) -> dict:
        """The newest records in `snapshot()`'s form, with the counts ever appended."""
        offset = self._offset
        collectives = min(collectives, len(self._log))
        steps = min(steps, len(self._steps))
        recent = list(itertools.islice(reversed(self._log), collectives))[::-1]
        step_tail = list(itertools.islice(reversed(self._steps), steps))[::-1]
        return {
            "collectives": [_as_tuple(entry, offset) for entry in recent],
            "steps": [StepRecord(reps, start + offset, dur) for reps, start, dur in step_tail],
            "pending": self.in_flight(),
            "marks": self._marks_wall_clock(),
            "appended": self.appended,
            "steps_appended": self.steps_appended,
            "replica_check": self.replica_check,
        }

    def snapshot(self) -> dict:
        """Every record as named records with wall-clock times (picklable, for the notebook).

        Example:
            >>> t = Telemetry()
            >>> t.record("all_gather", 8, "local", (0,), now(), 0.001, (0.0,))
            >>> sorted(Telemetry().snapshot())  # doctest: +NORMALIZE_WHITESPACE
            ['aggregates', 'appended', 'collectives', 'marks', 'pending', 'replica_check', 'steps',
             'steps_appended']
        """
        offset = self._offset
        collectives = [_as_tuple(entry, offset) for entry in list(self._log)]
        steps = [StepRecord(reps, start + offset, duration)
                 for reps, start, duration in list(self._steps)]  # fmt: skip
        aggregates = {op: dataclasses.asdict(a) for op, a in self.aggregates.items()}
        return {
            "collectives": collectives,
            "steps": steps,
            "pending": self.in_flight(),
            "marks": self._marks_wall_clock(),
            "aggregates": aggregates,
            "appended": self.appended,
            "steps_appended": self.steps_appended,
            "replica_check": self.replica_check,
        }

    def records(self, last: int | None = None) -> list[CollectiveRecord]:
        """The records kept, oldest first (only the newest `last` when given).

        Example:
            >>> t = Telemetry()
            >>> t.record_arrivals("all_reduce:SUM", 8, "local", (0, 1), (1.0, 1.5), 2.0)
            >>> t.records(last=1)[0].waits
            (0.5, 0.0)
        """
        if last is None:
            entries = list(self._log)
        else:
            entries = list(itertools.islice(reversed(self._log), last))[::-1]
        return [_as_tuple(entry, 0.0) for entry in entries]

    def clear(self) -> None:
        """Forget every record."""
        self._log.clear()
        self._steps.clear()
        self._marks.clear()
        self.aggregates.clear()
        self.version += 1

    def __len__(self) -> int:
        return len(self._log)


def _as_tuple(entry: tuple, offset: float) -> CollectiveRecord:
    """A log entry as a `CollectiveRecord`, its start moved by `offset` (to wall-clock)."""
    if len(entry) == 7:
        op, nbytes, implementation, replicas, start, duration, waits = entry
        return CollectiveRecord(
            op, nbytes, implementation, replicas, start + offset, duration, tuple(waits)
        )
    op, nbytes, implementation, replicas, arrivals, ready = entry
    first, last = min(arrivals), max(arrivals)
    waits = tuple(last - a for a in arrivals)
    return CollectiveRecord(op, nbytes, implementation, replicas, first + offset, ready - first,
                            waits)  # fmt: skip


def now() -> float:
    """The clock every record uses."""
    return time.perf_counter()
