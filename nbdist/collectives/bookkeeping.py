"""One bookkeeping context for every collective of a `DistGroup`: its number, the telemetry
(in progress, then done), the collective recorder, and the diagnosis when it fails.

Every path that runs a collective (`nbdist.collectives.all_reduce`'s table lists them) calls
`begin` before it and `end` after it, and turns a `RuntimeError` out of torch into
`diagnose(...)`'s error; `run` does the three around one launch. So the sequence number a
replica's error names (`#12` in "released from all_reduce:SUM #12"), the dashboard's stuck
view, `%dist stack`'s "in all_reduce #12 for 8.2 s" and `nd.debug.compare_collectives` all
read the same count, written in one place.

Example (what every path does)::

    number = books.begin("all_reduce:SUM", (4,), torch.float32, 16)
    try:
        work.wait()
    except RuntimeError as error:
        raise books.diagnose("all_reduce:SUM", error) from error
    finally:
        books.end(number)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from nbdist.collectives.recorder import CollectiveRecorder, call_site
from nbdist.errors import CollectiveTimeoutError, WorkerLostError
from nbdist.telemetry.records import Telemetry

__all__ = ["Bookkeeping", "shape_of"]


class Bookkeeping:
    """The count, telemetry, recorder and failure state of one process group's collectives.

    Args:
        rank, world_size, backend: The group's.
        telemetry: Where finished and in-progress collectives are recorded, or None.
        abandoned: Reads why the group was abandoned (`DistGroup.abandoned`), else None.
        diagnose_lost: Names the ranks missing from a failed collective
            (`Liveness.diagnose`).
        forget_layouts: Called when a collective fails (its agreed layouts no longer hold).
        abandon_kind: The error class an abandoned group's blocked collective raises
            (`"CollectiveTimeoutError"` after a timeout enforced by `held.TimeoutWatch`), or
            None (`WorkerLostError`).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        backend: str,
        telemetry: Telemetry | None,
        abandoned: Callable[[], tuple[str, tuple[int, ...], bool] | None],
        diagnose_lost: Callable[[str, BaseException], Exception],
        forget_layouts: Callable[[], None],
        abandon_kind: Callable[[], str | None] = lambda: None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.telemetry = telemetry
        self.ranks = (rank,)  # the replicas of this process's telemetry records
        self.entered = 0
        """Collectives entered in this group generation (the one that failed included)."""
        self.async_numbers: dict[int, int] = {}  # id(work) -> its collective number
        self.broken: str | None = None
        """Why the group is unusable (a collective failed, or it was abandoned), else None."""
        self.recorder = CollectiveRecorder()
        self._abandoned = abandoned
        self._diagnose_lost = diagnose_lost
        self._forget_layouts = forget_layouts
        self._abandon_kind = abandon_kind

    def reset(self, generation: str) -> None:
        """A new group generation: numbers from 1 again, nothing broken, no entries."""
        self.entered = 0
        self.async_numbers.clear()
        self.broken = None
        self.recorder.reset(generation)

    def require_usable(self, message: str | None = None) -> None:
        """Raise `WorkerLostError` when an earlier collective left the group unusable."""
        if self.broken is not None:
            raise WorkerLostError(
                message.format(self.broken)
                if message
                else f"The process group is unusable after an earlier failure ({self.broken}). "
                "Restart the workers and create a new strategy."
            )

    def begin(
        self, what: str, shape: Any, dtype: Any, nbytes: int, start: float | None = None
    ) -> int:
        """Number the collective `what` and mark it in progress; returns its number."""
        self.entered += 1
        number = self.entered
        telemetry = self.telemetry
        if telemetry is not None:  # in progress, for the dashboard's stuck view
            telemetry.begin(number, what, self.ranks, [start or time.perf_counter()])
        recorder = self.recorder
        if recorder.capacity:
            recorder.begin(number, what, shape, dtype, nbytes, call_site(2))
        return number

    def end(self, number: int) -> None:
        """The collective `begin` numbered is over (finished or failed)."""
        telemetry = self.telemetry
        if telemetry is not None:
            telemetry.end(number)
        self.recorder.end(number)

    def run(
        self,
        what: str,
        launch: Callable[[bool], Any],
        timeout: float | None,
        group_timeout: float,
        meta: tuple = (None, None, 0),
    ) -> Any:
        """Run one collective (`launch(async_op)`) with the whole bookkeeping: refused when
        the group is broken, numbered, timed out after `timeout` when it differs from the
        group's own, diagnosed when it fails. `meta`: `(shape, dtype, bytes)` it carries."""
        self.require_usable()
        number = self.begin(what, *meta)
        try:
            if timeout is None or timeout == group_timeout:
                return launch(False)
            work = launch(True)
            work.wait(timedelta(seconds=timeout))
            return work
        except RuntimeError as error:
            raise self.diagnose(what, error) from error
        finally:
            self.end(number)

    def start_async(self, what: str, launch: Callable[[], Any], meta: tuple) -> Any:
        """Start an asynchronous collective (gradient buckets); `wait` finishes it."""
        self.require_usable("The process group is unusable ({}).")
        self.entered += 1
        number = self.entered
        recorder = self.recorder
        if recorder.capacity:
            recorder.begin(number, what, *meta, call_site(2))
        try:
            work = launch()
        except RuntimeError as error:
            recorder.end(number)
            raise self.diagnose(what, error) from error
        self.async_numbers[id(work)] = number
        return work

    def wait(self, work: Any, what: str) -> None:
        """Wait for an asynchronous collective, naming the missing ranks if it fails."""
        number = self.async_numbers.pop(id(work), None)
        telemetry = self.telemetry if number is not None else None
        if telemetry is not None:  # in progress, for the dashboard's stuck view
            telemetry.begin(number, what, self.ranks, [time.perf_counter()])
        try:
            work.wait()
        except RuntimeError as error:
            raise self.diagnose(what, error) from error
        finally:
            if telemetry is not None:
                telemetry.end(number)
            if number is not None:
                self.recorder.end(number)

    def diagnose(self, what: str, error: BaseException) -> Exception:
        """The error to raise for the failed collective `what`: the ranks that did not take
        part, named; the group is unusable from now on."""
        self._forget_layouts()
        abandoned = self._abandoned()
        if abandoned is not None:
            reason, missing, _ = abandoned
            kind = self._abandon_kind()
            if kind in ("CollectiveTimeoutError", "WorkerLostError"):  # Note [Held replicas]
                self.broken = reason
                self.dump_recorder()
                if kind == "CollectiveTimeoutError":
                    return CollectiveTimeoutError(reason, missing=missing)
                return WorkerLostError(reason, missing=missing)
            return WorkerLostError(
                f"{what} on rank {self.rank} of {self.world_size} was abandoned: {reason}.",
                missing=missing,
            )
        self.broken = f"{what} failed: {error}"
        self.dump_recorder()
        return self._diagnose_lost(what, error)

    def dump_recorder(self) -> str | None:
        """Write the recorder to `nbdist-collectives-<pid>.json` in the temporary directory
        (done when a collective fails or times out); returns the path, or None."""
        import os
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"nbdist-collectives-{os.getpid()}.json")
        try:
            return self.recorder.dump(path)
        except OSError:  # a full or read-only disk: the record stays in memory
            return None

    def record(self, op: str, nbytes: int, start: float) -> None:
        """Record a finished collective in the telemetry (when it is enabled)."""
        telemetry = self.telemetry
        if telemetry is not None and telemetry.enabled:
            duration = time.perf_counter() - start
            telemetry.record(op, nbytes, self.backend, self.ranks, start, duration, (duration,))


def shape_of(tensors: Any) -> tuple:
    """`(shape, dtype, bytes)` of the tensors a user collective carries (the recorder's
    `meta`): one tensor's shape, or a tuple of shapes for several."""
    if len(tensors) == 1:
        t = tensors[0]
        return (tuple(t.shape), t.dtype, t.numel() * t.element_size())
    return (
        tuple(tuple(t.shape) for t in tensors),
        tensors[0].dtype if tensors else None,
        sum(t.numel() * t.element_size() for t in tensors),
    )
