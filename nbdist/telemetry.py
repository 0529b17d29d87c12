"""A bounded in-memory record of every collective and step, written by the strategies, read by
dashboards.

Recording appends one tuple to a `deque`; the dataclass view is built only when read, so
recording stays well under 2 % of a 4 KiB all-reduce. When the log is full, the oldest record
is folded into a per-op aggregate (count, bytes, total time, a log2 histogram of durations)
instead of being lost, so memory stays bounded however long training runs. `snapshot()`
turns everything into plain tuples (for sending from engines to the notebook); its times are
wall-clock seconds so that several processes' records line up. Imports nothing from nbdist.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from collections.abc import Sequence

__all__ = ["HISTOGRAM_BINS", "CollectiveRecord", "OpAggregate", "StepRecord", "Telemetry", "now"]

HISTOGRAM_BINS = 32
"""Duration histogram bins: bin k holds durations in [2**k, 2**(k+1)) microseconds."""


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    """What one collective did.

    Attributes:
        op: The collective (`"all_reduce:SUM"`, `"all_gather"`, `"merge_call"`, ...).
        nbytes: Bytes each replica contributed.
        implementation: How it ran (`"local"`, `"gloo"`, `"nccl"`, a CrossDeviceOps name).
        replicas: The replica ids taking part.
        start: `time.perf_counter()` when the first replica arrived.
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


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One `strategy.run` call: which replicas ran, when it started and how long it took.

    A step's communication time is the collectives' time inside it; the rest is compute.
    """

    replicas: tuple[int, ...]
    start: float
    duration: float


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
        recent = self.records(last=collectives) if collectives else []
        step_tail = list(itertools.islice(reversed(self._steps), steps))[::-1]
        return {
            "collectives": [
                (r.op, r.nbytes, r.implementation, r.replicas, r.start + offset, r.duration,
                 r.waits)
                for r in recent
            ],
            "steps": [(reps, start + offset, duration) for reps, start, duration in step_tail],
            "appended": self.appended,
            "steps_appended": self.steps_appended,
        }  # fmt: skip

    def snapshot(self) -> dict:
        """Every record as plain tuples with wall-clock times (picklable, for the notebook).

        Example:
            >>> t = Telemetry()
            >>> t.record("all_gather", 8, "local", (0,), now(), 0.001, (0.0,))
            >>> sorted(Telemetry().snapshot())
            ['aggregates', 'appended', 'collectives', 'steps', 'steps_appended']
        """
        offset = self._offset
        collectives = [
            (r.op, r.nbytes, r.implementation, r.replicas, r.start + offset, r.duration, r.waits)
            for r in self.records()
        ]
        steps = [(s.replicas, s.start + offset, s.duration) for s in self.steps()]
        aggregates = {op: dataclasses.asdict(a) for op, a in self.aggregates.items()}
        return {
            "collectives": collectives,
            "steps": steps,
            "aggregates": aggregates,
            "appended": self.appended,
            "steps_appended": self.steps_appended,
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
        return [_as_record(entry) for entry in entries]

    def clear(self) -> None:
        """Forget every record."""
        self._log.clear()
        self._steps.clear()
        self.aggregates.clear()
        self.version += 1

    def __len__(self) -> int:
        return len(self._log)


def _as_record(entry: tuple) -> CollectiveRecord:
    if len(entry) == 7:
        op, nbytes, implementation, replicas, start, duration, waits = entry
        return CollectiveRecord(op, nbytes, implementation, replicas, start, duration, tuple(waits))
    op, nbytes, implementation, replicas, arrivals, ready = entry
    first, last = min(arrivals), max(arrivals)
    waits = tuple(last - a for a in arrivals)
    return CollectiveRecord(op, nbytes, implementation, replicas, first, ready - first, waits)


def now() -> float:
    """The clock every record uses."""
    return time.perf_counter()
