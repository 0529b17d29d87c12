"""In-process collectives: the replica threads of one strategy meet at numbered slots.

Note [Local rendezvous]: every replica counts the collectives it calls; the k-th call of every
replica meets at slot k. The last replica to arrive combines the payloads (outside the lock) and
wakes the others, who each finish their own share (a copy to their device) in parallel. A slot
never waits forever: a replica that failed, or whose function returned without arriving, releases
the others at once, and the strategy's timeout names the replicas that never came.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nbdist.errors import CollectiveMismatchError, CollectiveTimeoutError, ReplicaReleasedError
from nbdist.telemetry.records import Telemetry

__all__ = ["LocalGroup"]


class _Slot:
    __slots__ = (
        "arrivals", "combiner", "done_event", "error", "events", "kind", "payloads", "picked",
        "ready_at", "shared", "state",
    )  # fmt: skip

    def __init__(self, kind: str, size: int):
        self.kind = kind
        self.payloads: list[Any] = [None] * size
        self.arrivals: list[float | None] = [None] * size
        self.state = "open"  # open -> combining -> done | failed
        self.combiner = -1  # the replica that combines (runs a merge_call's function)
        self.shared: Any = None
        self.error: BaseException | None = None
        self.picked = 0
        self.ready_at = 0.0
        # CUDA only: each replica's event on its stream when it arrived, and the combiner's
        # event after combining (see Note [Streams in an exchange]).
        self.events: list[Any] = [None] * size
        self.done_event: Any = None


def _producer_event() -> Any:
    """An event on this thread's current CUDA stream, or None when CUDA is not in use.

    Note [Streams in an exchange]: each replica of an in-process strategy computes on its own
    CUDA stream. A tensor a replica hands to an exchange may still be being written on that
    stream, so the replica that combines (on another stream) first waits for every producer's
    event; each replica then waits for the combiner's event before using the shared result.
    """
    if not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_stream().record_event()


def _wait_for(events: list[Any]) -> None:
    """Make this thread's current CUDA stream wait for each event (None: nothing to wait for)."""
    for event in events:
        if event is not None:
            torch.cuda.current_stream().wait_event(event)


class LocalGroup:
    """The rendezvous of the replica threads of one in-process strategy.

    Context: `exchange` is called from replica threads inside `strategy.run`.
    Hangs if: never; a missing replica is reported at once when it has returned or failed, and
    otherwise after `timeout` seconds; a replica that arrived waits at most `timeout` seconds
    in every state, also while the last replica to arrive combines (e.g. runs a merge_call
    function that never returns).

    Example:
        >>> import threading
        >>> group = LocalGroup(2, timeout=5.0)
        >>> group.begin_run()
        >>> out = [None, None]
        >>> def replica(i):
        ...     out[i] = group.exchange(i, "sum", i + 1, combine=sum)
        >>> threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
        >>> for t in threads: t.start()
        >>> for t in threads: t.join()
        >>> out
        [3, 3]
    """

    def __init__(self, size: int, *, timeout: float, telemetry: Telemetry | None = None):
        self.size = size
        self.timeout = timeout
        self.telemetry = telemetry
        self._replica_ids = tuple(range(size))
        self._cond = threading.Condition()
        self.begin_run()

    def begin_run(self) -> None:
        """Reset the rendezvous before a `strategy.run`."""
        with self._cond:
            for slot in getattr(self, "_slots", {}).values():
                self._end(slot)
            self._calls = [0] * self.size
            self._slots: dict[int, _Slot] = {}
            self._finished: set[int] = set()
            self._failed: dict[int, BaseException] = {}

    def replica_finished(self, replica: int) -> None:
        """Mark a replica's function as returned: collectives it never reached fail at once."""
        with self._cond:
            self._finished.add(replica)
            self._cond.notify_all()

    def replica_failed(self, replica: int, error: BaseException) -> None:
        """Mark a replica as failed: every replica waiting in a collective is released."""
        with self._cond:
            self._failed.setdefault(replica, error)
            self._finished.add(replica)
            self._cond.notify_all()

    def exchange(
        self,
        replica: int,
        kind: str,
        payload: Any,
        combine: Callable[[list[Any]], Any],
        finish: Callable[[Any, int], Any] | None = None,
        *,
        nbytes: int = 0,
        implementation: str = "local",
        timeout: float | None = None,
    ) -> Any:
        """Meet the other replicas at this replica's next collective and return its result.

        Args:
            replica: This replica's local index.
            kind: What is being called (`"all_reduce:SUM"`); every replica must call the same.
            payload: This replica's contribution.
            combine: Runs once, on the last replica to arrive, with every payload in replica
                order; returns the shared result.
            finish: Runs on every replica with the shared result and its index (e.g. a copy to
                its device); by default the shared result is returned as it is.
            nbytes: Bytes contributed by each replica (for telemetry).
            implementation: Name recorded in telemetry.
            timeout: Seconds to wait for the others (default: the group's timeout).
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            self._raise_if_released(replica, None)
            index = self._calls[replica]
            self._calls[replica] += 1
            slot = self._slots.get(index)
            if slot is None:
                slot = self._slots[index] = _Slot(kind, self.size)
                if self.telemetry is not None:  # in progress, for the dashboard's stuck view
                    self.telemetry.begin(slot, kind, self._replica_ids, slot.arrivals)
            elif slot.kind != kind:
                first = next(i for i, a in enumerate(slot.arrivals) if a is not None)
                slot.state = "failed"
                slot.error = CollectiveMismatchError(
                    f"Replicas called different collectives at collective #{index}: replica "
                    f"{first} called {slot.kind} but replica {replica} called {kind}. Every "
                    "replica must call the same collectives in the same order."
                )
                self._cond.notify_all()
                self._end(slot)
                raise slot.error
            slot.payloads[replica] = payload
            slot.events[replica] = _producer_event()
            slot.arrivals[replica] = time.perf_counter()
            if all(a is not None for a in slot.arrivals):
                slot.state, slot.combiner = "combining", replica
                combining = True
            else:
                combining = False
                try:
                    self._wait(slot, index, replica, deadline, timeout)
                except BaseException:
                    self._end(slot)
                    raise
        if combining:
            try:
                _wait_for(slot.events)
                shared = combine(slot.payloads)
                slot.done_event = _producer_event() if any(slot.events) else None
            except BaseException as error:
                with self._cond:
                    slot.state, slot.error = "failed", error
                    self._cond.notify_all()
                self._end(slot)
                raise
            ready = time.perf_counter()
            with self._cond:
                slot.shared, slot.state, slot.ready_at = shared, "done", ready
                slot.payloads = []
                self._cond.notify_all()
            self._record(slot, kind, nbytes, implementation)
        if slot.state == "failed":
            self._end(slot)
            raise slot.error  # type: ignore[misc]
        _wait_for([slot.done_event])
        result = slot.shared if finish is None else finish(slot.shared, replica)
        with self._cond:
            slot.picked += 1
            if slot.picked == self.size:
                self._slots.pop(index, None)
        return result

    def _wait(self, slot: _Slot, index: int, replica: int, deadline: float, timeout: float) -> None:
        while slot.state in ("open", "combining"):
            if slot.state == "open":
                self._raise_if_released(replica, slot, index)
            remaining = deadline - time.monotonic()
            if remaining <= 0 and slot.state == "open":
                missing = tuple(i for i, a in enumerate(slot.arrivals) if a is None)
                raise CollectiveTimeoutError(
                    f"Replica {replica} waited {timeout:g} s in {slot.kind} (collective "
                    f"#{index}) but replica(s) {_names(missing)} never arrived. Make every "
                    "replica call the same collectives, or raise the timeout with "
                    "CommunicationOptions(timeout_seconds=...).",
                    missing=missing,
                )
            if remaining <= 0:  # combining: the last replica to arrive has not finished
                raise CollectiveTimeoutError(
                    f"Replica {replica} waited {timeout:g} s in {slot.kind} (collective "
                    f"#{index}): every replica arrived, but replica {slot.combiner}, which "
                    f"combines it{_MERGE_NOTE if slot.kind == 'merge_call' else ''}, has not "
                    "finished. Make sure it can finish without the other replicas, or raise "
                    "the timeout with CommunicationOptions(timeout_seconds=...).",
                    missing=(slot.combiner,),
                )
            self._cond.wait(timeout=max(remaining, 0.05))

    def _raise_if_released(self, replica: int, slot: _Slot | None, index: int = -1) -> None:
        if self._failed:
            culprit, error = next(iter(self._failed.items()))
            if culprit != replica:
                raise ReplicaReleasedError(
                    f"Replica {replica} was released from a collective because replica "
                    f"{culprit} raised {type(error).__name__}: {error}"
                )
        if slot is None:
            return
        gone = tuple(i for i, a in enumerate(slot.arrivals) if a is None and i in self._finished)
        if gone:
            raise ReplicaReleasedError(
                f"Replica(s) {_names(gone)} returned from the function given to strategy.run "
                f"without calling {slot.kind} (collective #{index}), which replica {replica} "
                "is waiting in. Every replica must call the same collectives in the same order "
                "(e.g. no all_reduce or merge_call under `if replica_id == 0`)."
            )

    def _end(self, slot: _Slot) -> None:
        if self.telemetry is not None:
            self.telemetry.end(slot)

    def _record(self, slot: _Slot, kind: str, nbytes: int, implementation: str) -> None:
        telemetry = self.telemetry
        if telemetry is not None:
            telemetry.end(slot)
        if telemetry is not None and telemetry.enabled:
            telemetry.record_arrivals(
                kind, nbytes, implementation, self._replica_ids, slot.arrivals, slot.ready_at
            )


_MERGE_NOTE = " (runs the merge_call function, which must not wait for the replicas)"


def _names(replicas: Sequence[int]) -> str:
    return ", ".join(str(r) for r in replicas)
