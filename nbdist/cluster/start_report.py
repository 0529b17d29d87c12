"""What a cluster's start-up spent its time on: `StartClock` records it, `StartReport` shows it.

`Cluster.start` records a stage at each step (imports, engines launched, controller started,
engines registered one by one, the process group joined) and tells its `progress` callback
each one as it happens, with the seconds since the user began waiting: from the `%dist start`
magic's first line when the magic started the cluster (its imports included), else from
`start()`'s. `cluster.start_report()` returns the last start's `StartReport`, whose total is
what the user waited for.

Example:
    >>> lines = []
    >>> clock = StartClock(lines.append, began=0.0, now=iter([0.5, 1.25, 2.0]).__next__)
    >>> clock.stage("imports done")
    >>> clock.stage("2/2 engines registered")
    >>> report = clock.finish()
    >>> lines
    ['0.5 s  imports done', '1.2 s  2/2 engines registered']
    >>> [(s.name, s.seconds) for s in report.stages]
    [('imports done', 0.5), ('2/2 engines registered', 0.75)]
    >>> report.total
    2.0
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

__all__ = ["StartClock", "StartReport", "StartStage"]


@dataclasses.dataclass(frozen=True)
class StartStage:
    """One step of a start-up.

    Attributes:
        name: What was done, as printed ("2/2 engines registered").
        at: Seconds since the user began waiting, when it was done.
        seconds: Seconds it took (since the previous stage).
    """

    name: str
    at: float
    seconds: float


@dataclasses.dataclass(frozen=True)
class StartReport:
    """A finished start-up, stage by stage (`Cluster.start_report()`).

    Attributes:
        stages: The stages in the order they happened.
        total: Seconds from the moment the user began waiting (the `%dist start` line, or the
            `start()` call) until every engine had its strategy.
    """

    stages: tuple[StartStage, ...]
    total: float

    def __str__(self) -> str:
        width = max((len(stage.name) for stage in self.stages), default=5)
        lines = [f"{'stage':<{width}}  {'took':>6}  {'at':>6}"]
        lines += [f"{s.name:<{width}}  {s.seconds:5.2f}s  {s.at:5.2f}s" for s in self.stages]
        lines.append(f"{'total':<{width}}  {'':>6}  {self.total:5.2f}s")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, object]:
        """The report as plain values (for JSON)."""
        return {
            "total": self.total,
            "stages": [dataclasses.asdict(stage) for stage in self.stages],
        }


class StartClock:
    """Records the stages of one start-up and tells `progress` each one as it happens.

    Args:
        progress: Called with `"<seconds since began> s  <stage>"` at each stage.
        began: `time.perf_counter()` value when the user began waiting (default: now).
        now: The clock (`time.perf_counter`); tests pass their own.
    """

    def __init__(
        self,
        progress: Callable[[str], None],
        began: float | None = None,
        now: Callable[[], float] = time.perf_counter,
    ):
        self._progress = progress
        self._now = now
        self.began = now() if began is None else began
        self._last = self.began
        self._stages: list[StartStage] = []

    def stage(self, name: str) -> None:
        """Record that `name` is done now, and say so."""
        moment = self._now()
        self._stages.append(StartStage(name, moment - self.began, moment - self._last))
        self._last = moment
        self._progress(f"{moment - self.began:.1f} s  {name}")

    def say(self, line: str) -> None:
        """Tell `progress` a line that is not a stage (a host check's result)."""
        self._progress(line)

    def finish(self) -> StartReport:
        """The report, its total up to now."""
        return StartReport(tuple(self._stages), self._now() - self.began)
