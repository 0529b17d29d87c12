"""`CallGuard`: what every call into a cluster's engines checks first, and the group's health.

A mixin of `Cluster` (its methods are the cluster's): one call at a time (`turn`, Note [One
call at a time]), the checks a call makes before it sends anything (`require_alive`,
`require_usable`, `require_idle`), requests counted until answered (`track_request`), and the
process group's health (Note [Cluster health] in `supervisor`): marked unusable, abandoned on every
engine (`abort_group`) or formed again keeping the engines' variables (`repair`).

Example (needs running engines, so not run here)::

    with cluster.turn("strategy.run", timeout=10) as deadline:
        cluster.require_usable("strategy.run", wait=cluster.time_left("strategy.run", 10, deadline))
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nbdist.cluster.engine_side import health
from nbdist.cluster.errors import ClusterUnusableError
from nbdist.cluster.launch.plan import LaunchPlan
from nbdist.cluster.replies import interrupt_note, reply_ok
from nbdist.cluster.status import EngineInfo, StatusTable
from nbdist.errors import BusyError, WorkerLostError

__all__ = ["SURVIVORS", "CallGuard"]

SURVIVORS = (
    " Or continue on the live engines with their state (parameters, optimizers, data "
    "position): `%dist scale --survivors` (cluster.scale(survivors=True))."
)
"""The fix added where engines died (`cluster.scale`, nbdist.cluster.scaling)."""


class CallGuard:
    """The call checks and group health of `Cluster` (see the module's docstring)."""

    _plan: LaunchPlan
    _client: Any
    _engines: tuple[EngineInfo, ...]
    _turn_lock: threading.Lock
    _turn_holder: str | None
    _inflight: dict[int, set[Any]]
    _broken: str | None
    _repaired: str | None
    _reform_pending: str | None
    _rendezvous: tuple[str, int] | None
    _group_prefix: str | None
    _generation: int

    if TYPE_CHECKING:

        def status(self) -> StatusTable: ...  # Cluster's

    # Note [One call at a time]: every call into the engines (`strategy.run`, `run_steps`,
    # `push`, `pull`, a `%%distribute` cell) holds the cluster's turn from its checks to its
    # last reply, so the busy check and the submission are one step: two notebook threads
    # calling at once can never send requests whose collectives pair with each other's (they
    # gave wrong values, the replicas even disagreeing). A second call waits its turn, and
    # its timeout covers the wait; past it, `BusyError` names the call it waited for.
    @contextlib.contextmanager
    def turn(self, what: str, timeout: float | None = None) -> Iterator[float | None]:
        """Hold the cluster for one call (Note [One call at a time]); yields the call's
        deadline on `time.monotonic()`'s clock (None: no limit), `timeout` s after it began
        to wait (`time_left` says what is left).

        Raises:
            BusyError: (a `TimeoutError`) another thread's call still held the cluster after
                `timeout` seconds; nothing was sent.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout is None:
            acquired = self._turn_lock.acquire()
        else:
            acquired = self._turn_lock.acquire(timeout=timeout)
        if not acquired:
            raise BusyError(
                f"{what} waited {timeout:g} s for {self._turn_holder or 'another call'} to "
                "finish, and was not sent. Calls into one cluster from several threads run "
                "one at a time (the cluster is usable): give this call a longer timeout, or "
                "call the cluster from one thread."
            )
        self._turn_holder = f"{what} (thread {threading.current_thread().name!r})"
        try:
            yield deadline
        finally:
            self._turn_holder = None
            self._turn_lock.release()

    def time_left(self, what: str, timeout: float | None, deadline: float | None) -> float | None:
        """Seconds left until `deadline` (None: no limit); `BusyError` when waiting for earlier
        calls used up the call's `timeout`."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left > 0:
            return left
        raise BusyError(
            f"{what} waited {timeout:g} s for earlier calls into the cluster to finish, and "
            "was not sent. Calls into one cluster run one at a time (the cluster is usable): "
            "give this call a longer timeout."
        )

    def track_request(self, engine_id: int, request: Any) -> None:
        """Count `request` (an AsyncResult) as running on the engine until it is answered."""
        pending = self._inflight.setdefault(engine_id, set())
        pending.add(request)
        request.add_done_callback(pending.discard)

    def require_alive(self, what: str, fix: str = "cluster.restart()") -> None:
        """Raise `WorkerLostError` naming the dead engines' replicas before sending `what`.

        A request to a dead engine would never be answered (ipyparallel also refuses to
        address an unregistered engine), so calls check first and name the fix.
        """
        dead = tuple(row.rank for row in self.status() if row.state == "dead")
        if dead:
            raise WorkerLostError(
                f"The engine(s) of replica(s) {list(dead)} are dead (their process exited), so "
                f"{what} was not run. Run {fix} to start fresh engines (engine state is lost), "
                f"then run it again.{SURVIVORS}",
                missing=dead,
            )

    def require_usable(
        self, what: str, fix: str = "cluster.restart()", *, wait: float | None = 0.0
    ) -> None:
        """Raise `ClusterUnusableError` naming what happened and `fix` if the process group
        is unusable (Note [Cluster health] in `supervisor`), so `what` never pairs with a stuck
        collective or queues behind a blocked engine; then `require_idle(what, fix, wait)`."""
        if self._broken is not None:
            raise ClusterUnusableError(
                f"{what} was not run: the cluster is unusable because {self._broken}. Run {fix} "
                f"to start fresh engines (engine state is lost), then run it again.{SURVIVORS}"
                if any(row.state == "dead" for row in self.status())
                else f"{what} was not run: the cluster is unusable because {self._broken}. Run "
                f"{fix} to start fresh engines (engine state is lost), then run it again.",
                reason=self._broken,
            )
        self.require_idle(what, fix, wait=wait)
        if self._reform_pending is not None:
            reason, self._reform_pending = self._reform_pending, None
            problem = self.repair(reason)
            if problem is not None:
                self.mark_broken(f"{reason}; forming the process group again failed: {problem}")
                self.require_usable(what, fix)

    def require_idle(
        self, what: str, fix: str = "cluster.restart()", *, wait: float | None = 0.0
    ) -> None:
        """Wait up to `wait` seconds (None: no limit) for engines still running an earlier
        request (`what` would queue behind it). Still busy: `ClusterUnusableError` when the
        cluster is unusable (an engine left blocked), else `BusyError`; either says what a
        replica runs when it caught an interrupt and went on."""
        pending = [request for requests in self._inflight.values() for request in requests]
        if pending and self._broken is None and (wait is None or wait > 0):
            concurrent.futures.wait(pending, timeout=wait)
        busy = [row.rank for row in self.status() if row.state == "busy"]
        if not busy:
            return
        notes = self.busy_notes()
        running = "".join(f" Replica {rank} {notes[rank]}." for rank in busy if rank in notes)
        if self._broken is not None:
            raise ClusterUnusableError(
                f"{what} was not run: replica(s) {busy} are still busy with an earlier request, "
                f"and the cluster is unusable because {self._broken}.{running} Run {fix} to "
                "start fresh engines (engine state is lost).",
                reason=self._broken,
            )
        waited = "" if not wait else f" after {wait:g} s"
        raise BusyError(
            f"{what} was not sent: replica(s) {busy} were still busy with an earlier "
            f"request{waited}.{running} The cluster is usable: run it again once they finish "
            f"(or give it a longer timeout), or run {fix} to stop them (engine state is lost)."
        )

    def busy_notes(self) -> dict[int, str]:
        """`{replica: note}` for engines running on after catching a `KeyboardInterrupt`
        (Note [Caught interrupts] in `supervisor`): what they run now."""
        notes = {}
        for info in self._engines:
            for request in list(self._inflight.get(info.id, ())):
                note = interrupt_note(self._client, request)
                if note:
                    notes[info.rank] = note
        return notes

    def reform_when_idle(self, reason: str) -> None:
        """Form the process group again before the next call that needs it, once every engine
        is idle (an interrupt abandoned it while an engine ran on: Note [Caught interrupts] in
        `supervisor`)."""
        self._reform_pending = self._reform_pending or reason

    def mark_broken(self, reason: str) -> None:
        """Record why the process group is unusable (the first reason is kept) until restart."""
        if self._broken is None:
            self._broken = reason

    def group_store(self) -> tuple[str, int, str] | None:
        """The rendezvous store's address and port and the group generation's key prefix
        (where the engines' heartbeats are); None before the group is formed."""
        if self._rendezvous is None or self._group_prefix is None:
            return None
        return (*self._rendezvous, self._group_prefix)

    def abort_group(self, reason: str) -> bool:
        """Abandon the engines' process group on every engine (Note [Waking a blocked
        collective] in `nbdist.collectives.abort`): collectives blocked in C fail within a
        heartbeat. False when the rendezvous store cannot be reached."""
        if self._rendezvous is None or self._group_prefix is None:
            return False
        if any(row.rank == 0 and row.state == "dead" for row in self.status()):
            return False  # the store died with engine 0, and so did the group's connections
        from nbdist.collectives.abort import request_abort

        addr, port = self._rendezvous
        return request_abort(addr, port, self._group_prefix, reason, timeout=2.0)

    def repair(self, reason: str) -> str | None:
        """Form the process group again on every engine, keeping their Python state; None on
        success (recorded in `repaired`), else what went wrong. Every engine must be idle."""
        self._generation += 1
        generation = f"r{self._generation}"
        ids = [info.id for info in self._engines]
        try:
            result = self._client.direct_view(ids).apply_async(health.reform, generation)
            replies = result.get(timeout=min(self._plan.timeout, 30.0))
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        replies = replies if isinstance(replies, list) else [replies]
        bad = [r for r in replies if not reply_ok(r)]
        if bad:
            reply = bad[0]
            return f"{reply.get('ename')}: {reply.get('evalue')}"
        base = (self._group_prefix or "nbdist/0/").rstrip("/").rpartition("/")[0] or "nbdist"
        self._group_prefix = f"{base}/{generation}/"
        self._repaired = reason
        return None
