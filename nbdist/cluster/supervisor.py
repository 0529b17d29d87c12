"""The one path by which the notebook calls its engines: `supervise` and its `Supervisor`.

`supervise(cluster, engines, entry, payloads)` sends one request to every engine (`entry` is
an engine-side function, e.g. `engine_side.calls.call` or `engine_side.cell.run_cell`, sent
by reference; one `DirectView.apply`, or one apply per engine when their arguments differ),
tracks it on the cluster, shows what the engines print as it arrives (`output.OutputPrinter`),
waits under a deadline, turns Ctrl-C and timeouts into interrupts of the engines, settles the
cluster's health, raises one `RemoteError` for every failed replica, and unpickles the values.
`strategy.run`, `run_steps`, `push`, `pull` (through `calls.call_engines`) and `%%distribute`
(`magics._cell`) all call it; the ps cluster's channel submits through `submit_one`.

While waiting, a supervisor watches for the situation a process group cannot
get out of by itself: an engine is idle again (its function finished or failed) while its peers
are blocked in a collective it will never join. Gloo waits in C++, where neither an error
notice nor SIGINT reaches them, until the collective timeout (300 s by default).

Note [Releasing blocked peers]: once some engines are idle and others still run, the
supervisor asks an idle engine whether peers have entered more collectives than it has, or sit
in a `torch.distributed` call of their own (their heartbeats say so). If they have, that engine
abandons the group on every rank (Note [Waking a blocked collective] in
`nbdist.collectives.abort`): the peers' calls fail within a heartbeat with an error naming the
replica that never arrived, and every engine keeps its Python state.

Note [Cluster health]: a timeout, an interrupt, an abandoned group, a failed collective or a
dead engine leaves the process group in an unknown state. `Supervisor.settle` decides what it
is now: when every engine is alive and idle again, the group is formed again on all of them
(`Cluster.repair`, keeping their variables), and the cluster is usable; otherwise the cluster
is marked unusable (`Cluster.mark_broken`), and the next cell or `strategy.run` refuses with
`ClusterUnusableError` naming what happened and the fix. Nothing ever pairs a new collective
with a stuck one.

Note [Caught interrupts]: user code may catch the `KeyboardInterrupt` that SIGINT raises and
go on running Python (`except KeyboardInterrupt: pass`). Such an engine is not blocked: it
will come back, and it publishes where it runs (`engine_side.guards`). The supervisor names it
("replica 1 caught the KeyboardInterrupt ... and is still running line 6 (...)") and does not
mark the cluster unusable: calls are refused while it is busy (naming that line), and the
group, abandoned by the interrupt, is formed again before the next call once every engine is
idle (`Cluster.reform_when_idle`). Only engines that publish nothing (blocked in C, or
ignoring SIGINT) make the cluster unusable.

A host that drops off the network in the middle of a call is noticed from its engines'
heartbeats in the rendezvous store (Note [A host that drops off] in `nbdist.cluster.heartbeats`):
the supervisor abandons the group, so the other replicas' collectives fail at once, ends the
call with an error naming the lost replicas and their hosts, and marks the cluster unusable
(its engines may come back, but their requests are lost).

Timeouts and Ctrl-C interrupt the engines still running (SIGINT through ipyparallel's nanny)
and abandon the group (which releases engines blocked in C), then give them a few seconds to
come back.

Note [Signal before abort]: the SIGINT travels through the controller and each engine's nanny;
abandoning the group goes through the rendezvous store and wakes a blocked collective within a
heartbeat. If the abandon wins (a loaded machine, seen once in CI), the blocked engine's call
ends with the collective's RuntimeError, and its SIGINT lands later, in whatever that engine
runs next: the group's re-forming, which it then breaks halfway, leaving its peer waiting in
the rendezvous until `repair` gives up (30 s) and the cluster is marked unusable. So
`interrupt` waits (up to `SIGNAL_ACK_S`) for the nannies to say they sent the signal before it
abandons the group: the signal is then pending in the engine, and the interrupted call ends
with it; and the engine-side re-forming ignores SIGINT (`health.reform`), so a signal that
still comes late cannot break it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist.cluster import _wire
from nbdist.cluster.debug_prompt import DebugConsole
from nbdist.cluster.engine_side.health import release_peers
from nbdist.cluster.errors import (
    ClusterInterrupted,
    EngineTimeoutError,
    RemoteError,
    RemoteFailure,
    SerializationError,
)
from nbdist.cluster.heartbeats import WATCH_AFTER_S, HeartbeatWatch
from nbdist.cluster.output import OutputPrinter
from nbdist.cluster.replies import (
    COLLECTIVE_ERRORS,
    after_death,
    doing,
    engine_error,
    failure_of,
    fix_stop,
    interrupt_note,
    reply_of,
    reply_ok,
)
from nbdist.cluster.sigint import interrupts_deferred
from nbdist.cluster.status import EngineInfo
from nbdist.cluster.turns import SURVIVORS

if TYPE_CHECKING:
    from nbdist.cluster.handle import ClusterHandle

__all__ = [
    "INTERRUPT_GRACE_S",
    "RELEASE_AFTER_S",
    "Call",
    "Supervisor",
    "checked_replies",
    "submit",
    "submit_one",
    "supervise",
]

SIGNAL_ACK_S = 2.0
"""Seconds `interrupt` waits for the engines' nannies to say they sent SIGINT (Note [Signal
before abort])."""
INTERRUPT_GRACE_S = 3.0
"""Seconds interrupted engines get to come back before they count as still busy (blocked
collectives are released within a heartbeat, so this is plenty)."""
RELEASE_AFTER_S = 1.5
"""Seconds an engine may finish ahead of its peers before they are checked for waiting on it."""
_RECHECK_S = 1.0
_RELEASE_TIMEOUT_S = 10.0
_POLL_S = 0.2
"""Seconds between looks at the engines' output while they run."""


@dataclasses.dataclass(frozen=True)
class Call:
    """How one call into the engines is named in what the user reads.

    Attributes:
        what: The call in errors, e.g. `"strategy.run(step)"` or `"a %%distribute cell"`.
        fix: What recovers an unusable cluster (`"cluster.restart()"`, `"`%dist restart`"`).
        subject: The call at the start of a timeout's sentence (default: `what`).
        longer: How to allow longer work, ending the timeout's message.
        advice: How to return something that travels, ending an unpickling error.
        hints: Adds notes to a `RemoteError` from its failures (e.g. a name that exists only
            in the notebook).
    """

    what: str
    fix: str = "cluster.restart()"
    subject: str = ""
    longer: str = "Raise the timeout (cluster.strategy.timeout, or timeout=) for longer work."
    advice: str = "Return tensors, numbers or containers of them."
    hints: Callable[[list[RemoteFailure]], list[str]] | None = None


def submit(
    client: Any, engines: Sequence[EngineInfo], entry: Callable[..., Any],
    payloads: bytes | Sequence[Any], extra: tuple = (),
) -> list[Any]:  # fmt: skip
    """Send `entry(payload, *extra)` to every engine; one AsyncResult per engine, in order.

    `entry` is an engine-side function, sent by reference (the engine imports its module).
    `payloads` is one payload for all engines, or a list with one per engine.
    """
    ids = [info.id for info in engines]
    if isinstance(payloads, (bytes, bytearray, str)):
        result = client.direct_view(ids).apply_async(entry, payloads, *extra)
        return list(result.split()) if len(ids) > 1 else [result]
    if len(payloads) != len(engines):
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{len(payloads)} payloads for {len(engines)} engines; pass one payload per engine, "
            "in replica order (or one bytes payload for all of them)."
        )
    return [
        client.direct_view([info.id]).apply_async(entry, payload, *extra)
        for info, payload in zip(engines, payloads)
    ]


def submit_one(client: Any, engine_id: int, entry: Callable[..., Any], *args: Any) -> Any:
    """Send `entry(*args)` to one engine (by reference); its AsyncResult."""
    return client.direct_view([engine_id]).apply_async(entry, *args)


def supervise(
    cluster: ClusterHandle,
    engines: Sequence[EngineInfo],
    entry: Callable[..., Any],
    payloads: bytes | Sequence[Any],
    *extra: Any,
    call: Call,
    timeout: float | None,
    deadline: float | None = None,
    printer: OutputPrinter | None = None,
    bystanders: Sequence[EngineInfo] = (),
) -> list[dict[str, Any]]:
    """Call `entry(payload, *extra)` on `engines` and see it through; replies in their order.

    Args:
        cluster: The running cluster (the caller holds its turn and checked it is usable).
        engines: The engines to call, in replica order.
        entry: An engine-side entry point returning a reply dict (`engine_side.calls.call`,
            `engine_side.cell.run_cell`, ...).
        payloads: One payload for every engine, or a list with one per engine.
        extra: More arguments, the same for every engine.
        call: How the call is named in errors (`Call`).
        timeout: Seconds the call may take (None: no limit), as the error names it.
        deadline: When the wait ends on `time.monotonic()`'s clock, if the call's `timeout`
            began earlier (it waited for its turn); default `timeout` s from now.
        printer: Shows the engines' output live (default: `OutputPrinter()`, every replica).
        bystanders: Engines of the group that do not run this call (`%%distribute
            --targets`).

    Returns:
        The reply dicts, each `"value"` unpickled.

    Raises:
        RemoteError: one or more engines failed.
        EngineTimeoutError: not every engine finished within `timeout` (they were interrupted).
        ClusterInterrupted: (a `KeyboardInterrupt`) Ctrl-C; the engines were interrupted.
        SerializationError: a value cannot be unpickled here.
    """
    printer = printer if printer is not None else OutputPrinter()
    parts = submit(cluster.client, engines, entry, payloads, tuple(extra))
    for info, part in zip(engines, parts):
        cluster.track_request(info.id, part)
    supervisor = Supervisor(cluster, engines, parts, call.what, bystanders=bystanders)
    printer.start(engines, parts)
    if deadline is None and timeout is not None:
        deadline = time.monotonic() + timeout
    console = DebugConsole(cluster, engines, parts)  # breakpoint() on the engines
    try:
        while True:
            step = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if supervisor.wait(max(0.0, step)):
                break
            with interrupts_deferred():  # never inside ipykernel's flush: raised right after
                printer.poll()
            spent = console.poll()  # the prompt, while a replica is stopped in the debugger
            if deadline is not None:
                deadline += spent  # the time at the prompt does not count
            if deadline is not None and time.monotonic() >= deadline:
                pending, detail = supervisor.stop_after_timeout(timeout, call.fix)
                printer.finish()
                raise EngineTimeoutError(
                    f"{call.subject or call.what} did not finish within {timeout:g} s on "
                    f"replica(s) {pending}; they were interrupted.{detail} {call.longer}",
                    pending=tuple(pending),
                )
    except KeyboardInterrupt:
        console.close()
        error = supervisor.interrupted(call.fix)
        printer.finish()
        raise error from None
    finally:
        console.close()
    printer.finish()
    replies = checked_replies(
        cluster, engines, parts, supervisor, call.what, fix=call.fix, hints=call.hints
    )
    for info, reply in zip(engines, replies):
        try:
            reply["value"] = _wire.loads(reply["value"])
        except Exception as error:
            raise SerializationError(
                f"The result of replica {info.rank} in {call.what} cannot be unpickled in the "
                f"notebook: {type(error).__name__}: {error}. {call.advice}"
            ) from error
    return replies


class Supervisor:
    """Waits for one call on every engine; releases peers blocked by an idle engine, and
    settles the cluster's health after a fault (Notes [Releasing blocked peers] and [Cluster
    health])."""

    def __init__(
        self,
        cluster: ClusterHandle,
        engines: Sequence[EngineInfo],
        parts: list[Any],
        what: str,
        bystanders: Sequence[EngineInfo] = (),
    ):
        self.cluster = cluster
        self.engines = list(engines)
        self.parts = parts
        self.what = what
        self.bystanders = list(bystanders)
        """Engines of the group that do not run this call (`%%distribute --targets`): a
        collective waiting for them waits in vain, as for an engine that finished."""
        self.released: list[int] = []
        """Replicas that abandoned the group to release peers waiting for them."""
        self.fault: str | None = None
        """What went wrong with the group during this call (timeout, interrupt, release)."""
        self.destroyed: list[int] = []
        """Replicas whose user code destroyed the process group (`settle` forms it again)."""
        self._split_since: float | None = None
        self._next_check = 0.0
        self.lost: dict[int, str] = {}
        """Replicas whose heartbeats stopped during the call: `{replica: why}` (Note [A host
        that drops off] in `nbdist.cluster.heartbeats`); their requests are given up."""
        self._began = time.monotonic()
        self._watch: HeartbeatWatch | None = None

    def wait(self, timeout: float | None) -> bool:
        """Wait until every engine answered or was lost (True) or `timeout` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [
                part
                for info, part in zip(self.engines, self.parts)
                if not part.ready() and info.rank not in self.lost
            ]
            if not pending:
                self.stop_watch()
                return True
            now = time.monotonic()
            remaining = None if deadline is None else deadline - now
            if remaining is not None and remaining <= 0:
                return False
            step = remaining
            if self._watch_heartbeats(now):
                continue
            if self._watch is not None:  # look at the heartbeats' verdict often
                step = _POLL_S if step is None else min(step, _POLL_S)
            if not self.released and (len(pending) < len(self.parts) or self.bystanders):
                self._split_since = self._split_since or now
                failed = any(not reply_ok(reply_of(p)) for p in self.parts if p.ready())
                due = failed or now - self._split_since >= RELEASE_AFTER_S
                if due and now >= self._next_check:
                    self._release()
                    self._next_check = time.monotonic() + _RECHECK_S
                if not self.released:  # peers' heartbeats may lag: look again soon
                    step = _RECHECK_S / 2 if step is None else min(step, _RECHECK_S / 2)
            concurrent.futures.wait(
                pending, timeout=step, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def stop_watch(self) -> None:
        """Stop watching the engines' heartbeats (the call is over)."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    def _watch_heartbeats(self, now: float) -> bool:
        """Start the heartbeat watch once the call has run `WATCH_AFTER_S`; when replicas
        still running are lost, give them up: abandon the group (waking their peers) and
        interrupt the rest. True when that just happened."""
        if self.lost or self.fault or self.released:
            self.stop_watch()
            return False
        if self._watch is None:
            store = getattr(self.cluster, "group_store", lambda: None)()
            if store is None or now - self._began < WATCH_AFTER_S:
                return False
            self._watch = HeartbeatWatch(store, [info.rank for info in self.engines])
            self._watch.start()
            return False
        running = {info.rank for info, part in zip(self.engines, self.parts) if not part.ready()}
        lost = {rank: why for rank, why in self._watch.lost().items() if rank in running}
        if not lost:
            return False
        self.stop_watch()
        self.lost = lost
        hosts = sorted({info.host for info in self.engines if info.rank in lost})
        reason = (
            f"replica(s) {sorted(lost)} on host(s) {', '.join(hosts)} stopped sending "
            f"heartbeats during {self.what} (the host dropped off the network, or the "
            "engine's process is frozen)"
        )
        # no SIGINT: the replicas still here get the abandon's error naming the lost ones
        self.fault = reason
        self.cluster.abort_group(reason)
        return True

    def pending(self) -> list[int]:
        """The replicas whose engines have not answered yet."""
        return [info.rank for info, part in zip(self.engines, self.parts) if not part.ready()]

    def interrupt(self, reason: str) -> list[int]:
        """SIGINT the engines still running and abandon the group (releasing any blocked in
        a collective); their replica ids."""
        pending = [info for info, part in zip(self.engines, self.parts) if not part.ready()]
        if pending:
            self.fault = self.fault or reason
            with contextlib.suppress(Exception):
                sent = self.cluster.client.send_signal(
                    signal.SIGINT, targets=[info.id for info in pending], block=False
                )
                sent.result(timeout=SIGNAL_ACK_S)  # Note [Signal before abort]
            self.cluster.abort_group(reason)
        return [info.rank for info in pending]

    def stop_after_timeout(self, timeout: float | None, fix: str) -> tuple[list[int], str]:
        """Interrupt the engines still running after `timeout`, give them `INTERRUPT_GRACE_S`
        to come back and settle the cluster's health; their replica ids and a sentence on the
        cluster's state naming `fix` where needed."""
        pending = self.interrupt(f"{self.what} timed out after {timeout:g} s")
        self.wait(INTERRUPT_GRACE_S)
        return pending, self.settle(fix)

    def interrupted(self, fix: str) -> ClusterInterrupted:
        """After Ctrl-C: interrupt the engines, wait briefly, settle; the one-line error."""
        pending = self.interrupt(f"{self.what} was interrupted (Ctrl-C)")
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
            self.wait(INTERRUPT_GRACE_S)
        state = self.settle(fix).strip()
        each = "; ".join(
            f"replica {info.rank}: {doing(part)}" for info, part in zip(self.engines, self.parts)
        )
        if not pending:
            each = "every replica had finished"
        return ClusterInterrupted(f"{self.what} interrupted ({each}). {state}".rstrip())

    def settle(self, fix: str) -> str:
        """Decide the cluster's health after this call (Note [Cluster health]); a sentence."""
        still = self.pending()
        replies = [reply_of(part) if part.ready() else None for part in self.parts]
        died = [
            info.rank
            for info, reply in zip(self.engines, replies)
            if isinstance(reply, BaseException) and engine_error(reply)
        ]
        destroyed = [
            info.rank
            for info, reply in zip(self.engines, replies)
            if isinstance(reply, dict) and reply.get("group_destroyed")
        ]
        if destroyed:
            self.destroyed = destroyed
            self.fault = self.fault or (
                f"dist.destroy_process_group() on replica(s) {destroyed} ended the engines' "
                f"process group during {self.what}"
            )
        failed_collective = any(  # nbdist's collectives, or a torch.distributed call's error
            isinstance(reply, dict)
            and not reply_ok(reply)
            and (
                reply.get("ename") in COLLECTIVE_ERRORS
                or "torch.distributed." in str(reply.get("where") or "")
            )
            for reply in replies
        )
        if self.lost:
            hosts = sorted({info.host for info in self.engines if info.rank in self.lost})
            self.cluster.mark_broken(
                f"replica(s) {sorted(self.lost)} on host(s) {', '.join(hosts)} stopped sending "
                f"heartbeats during {self.what}"
            )
            return (
                f" Replica(s) {sorted(self.lost)} on {', '.join(hosts)} are lost; the cluster "
                f"is unusable: once the host(s) are reachable again, run {fix} (engine state is "
                "lost)."
            )
        if not (self.fault or self.released or failed_collective or died or still):
            if all(reply_ok(reply) for reply in replies):
                self.cluster.forget_repair()  # a later call succeeded: the repair is history
            return ""
        what = self.fault or (
            f"replica(s) {self.released} never arrived in a collective of {self.what}"
            if self.released
            else f"a collective failed in {self.what}"
        )
        if died:
            self.cluster.mark_broken(f"the engine(s) of replica(s) {died} died during {self.what}")
            return (
                f" Replica(s) {died} died; the cluster is unusable: run {fix} (engine state is "
                f"lost).{SURVIVORS}"
            )
        notes = {
            info.rank: interrupt_note(self.cluster.client, part)
            for info, part in zip(self.engines, self.parts)
            if not part.ready()
        }
        if still and all(notes.get(rank) for rank in still):
            # running Python, they will come back (Note [Caught interrupts]); the group is
            # formed again once every engine is idle.
            self.cluster.reform_when_idle(what)
            named = "; ".join(f"replica {rank} {notes[rank]}" for rank in still)
            return (
                f" {named[0].upper()}{named[1:]}. Nothing else runs on the cluster until "
                f"{'it finishes' if len(still) == 1 else 'they finish'} (the process group is "
                "then formed again, keeping the engines' variables); to stop waiting, run "
                f"{fix} (engine state is lost)."
            )
        if still:
            blocked = "blocked outside Python, or ignoring SIGINT"
            self.cluster.mark_broken(f"{what}, and replica(s) {still} are still busy ({blocked})")
            return (
                f" Replica(s) {still} are still busy ({blocked}); the cluster is "
                f"unusable: run {fix} (engine state is lost)."
            )
        problem = self.cluster.repair(what)
        if problem is None:
            return (
                " The process group was formed again; the engines kept their variables and "
                "the cluster is usable."
            )
        self.cluster.mark_broken(f"{what}; forming the process group again failed: {problem}")
        return (
            f" Forming the process group again failed ({problem}); the cluster is unusable: "
            f"run {fix} (engine state is lost)."
        )

    def _release(self) -> None:
        """Ask an idle engine to abandon the group if peers wait for it in a collective (Note
        [Releasing blocked peers])."""
        client = self.cluster.client
        idle = [(info, f"replica {info.rank} does not run {self.what}") for info in self.bystanders]
        for info, part in zip(self.engines, self.parts):
            if not part.ready():
                continue
            reply = reply_of(part)
            if isinstance(reply, BaseException):
                continue  # the engine died: its peers' collectives fail by themselves
            who = (
                f"replica {info.rank} finished {self.what}"
                if reply_ok(reply)
                else f"replica {info.rank} failed in {self.what} ({reply.get('ename')}: "
                f"{str(reply.get('evalue'))[:200]})"
            )
            idle.append((info, who))
        for info, who in idle:
            try:
                answer = (
                    client.direct_view([info.id])
                    .apply_async(release_peers, who)
                    .get(timeout=_RELEASE_TIMEOUT_S)
                )
            except Exception:
                continue
            answer = answer[0] if isinstance(answer, list) else answer
            if answer.get("left"):
                self.released.append(info.rank)
                self.fault = self.fault or (
                    f"{who} while replica(s) {answer.get('waiting')} waited for it in a collective"
                )
                return


def checked_replies(
    cluster: ClusterHandle,
    engines: Sequence[EngineInfo],
    parts: list[Any],
    supervisor: Supervisor,
    what: str,
    *,
    fix: str,
    hints: Callable[[list[RemoteFailure]], list[str]] | None = None,
) -> list[Any]:
    """The engines' replies, in replica order, once all have answered; one `RemoteError` for
    all failed replicas otherwise. The cluster's health is settled first (Note [Cluster
    health]), and the error says what state it is in now, naming `fix` (e.g.
    `"cluster.restart()"`) where needed, plus whatever `hints(failures)` adds."""
    replies = [
        _lost_reply(supervisor.lost[info.rank]) if info.rank in supervisor.lost and not
        part.ready() else reply_of(part)
        for info, part in zip(engines, parts)
    ]  # fmt: skip
    failures = [
        failure_of(info, reply) for info, reply in zip(engines, replies) if not reply_ok(reply)
    ]
    state = supervisor.settle(fix)
    if not failures:
        if supervisor.destroyed:  # formed again (or not): say so, the cell itself succeeded
            print(
                f"[nbdist] dist.destroy_process_group() on replica(s) {supervisor.destroyed} "
                f"ended the engines' process group.{state} To stop the engines, use {fix_stop(fix)}"
                " instead.",
                file=sys.stderr,
            )
        return replies
    died = [f.replica for f in failures if f.ename == "EngineError"]
    if died:  # a collective that failed because a peer died is that death's consequence
        failures = [after_death(f, died) for f in failures]
    notes = hints(failures) if hints is not None else []
    if state:
        notes.append(state.strip())
    raise RemoteError(what, failures, len(engines), notes)


def _lost_reply(why: str) -> dict[str, Any]:
    """The failed reply of a replica whose heartbeats stopped (it never answered)."""
    return {
        "ok": False,
        "ename": "HostUnreachableError",
        "evalue": f"its engine stopped sending heartbeats ({why}): its host dropped off the "
        "network, or the process is frozen",
        "traceback": "",
        "short": "",
    }
