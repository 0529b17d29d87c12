"""Calling every engine at once and waiting for them: `call_engines`, `Supervisor`.

One request goes to every engine (`DirectView.apply`, or one apply per engine when their
arguments differ). While waiting, a supervisor watches for the situation a process group cannot
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
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist.cluster import _wire, cell_names
from nbdist.cluster.engine_side import calls as engine_calls
from nbdist.cluster.engine_side.guards import INTERRUPT_KEY
from nbdist.cluster.engine_side.health import release_peers
from nbdist.cluster.errors import (
    ClusterInterrupted,
    EngineTimeoutError,
    RemoteError,
    RemoteFailure,
    SerializationError,
)
from nbdist.cluster.status import EngineInfo

if TYPE_CHECKING:
    from nbdist.cluster.handle import ClusterHandle

__all__ = [
    "INTERRUPT_GRACE_S",
    "OUTPUT_WAIT_S",
    "RELEASE_AFTER_S",
    "Supervisor",
    "call_engines",
    "checked_replies",
    "failure_of",
    "interrupt_note",
    "reply_of",
    "reply_ok",
    "say_late_output",
    "wait_for_outputs",
]

SIGNAL_ACK_S = 2.0
"""Seconds `interrupt` waits for the engines' nannies to say they sent SIGINT (Note [Signal
before abort])."""
INTERRUPT_GRACE_S = 3.0
"""Seconds interrupted engines get to come back before they count as still busy (blocked
collectives are released within a heartbeat, so this is plenty)."""
RELEASE_AFTER_S = 1.5
"""Seconds an engine may finish ahead of its peers before they are checked for waiting on it."""
OUTPUT_WAIT_S = 10.0
"""Seconds, in all, to wait for engines' printed output after their replies
(Note [Output after the reply])."""
_RECHECK_S = 1.0
_RELEASE_TIMEOUT_S = 10.0


def call_engines(
    cluster: ClusterHandle,
    entry: str,
    payloads: bytes | Sequence[Any],
    *extra: Any,
    timeout: float | None,
    what: str,
    fn: Any = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Call `engine_side.calls.<entry>(payload, *extra)` on every engine; replies in replica order.

    Args:
        cluster: A running cluster.
        entry: The name of a function of `engine_side.calls` that returns a reply dict
            (`"call"`, `"call_steps"`, `"store"` or `"fetch"`).
        payloads: One payload for every engine, or a list with one per engine.
        extra: More arguments, the same for every engine.
        timeout: Seconds to wait (None: no limit), as the error names it.
        deadline: When the wait ends on `time.monotonic()`'s clock, if the call's `timeout`
            began earlier (it waited for its turn); default `timeout` s from now.
        what: How to name the call in errors, e.g. `"strategy.run(step)"`.
        fn: The user's function, for hints about names it uses.

    Returns:
        The reply dicts in replica order, each `"value"` unpickled.

    Raises:
        WorkerLostError: an engine is dead (nothing was sent).
        RemoteError: one or more engines failed.
        EngineTimeoutError: not every engine finished within `timeout`.
        SerializationError: a result cannot be unpickled here.
    """
    cluster.require_alive(what)
    engines = cluster.engines
    parts = _submit(cluster.client, engines, entry, payloads, extra)
    for info, part in zip(engines, parts):
        cluster.track_request(info.id, part)
    supervisor = Supervisor(cluster, engines, parts, what)
    try:
        if deadline is not None:
            finished = supervisor.wait(max(0.0, deadline - time.monotonic()))
        else:
            finished = supervisor.wait(timeout)
    except KeyboardInterrupt:
        raise supervisor.interrupted("cluster.restart()") from None
    if not finished:
        pending, detail = supervisor.stop_after_timeout(timeout, "cluster.restart()")
        raise EngineTimeoutError(
            f"{what} did not finish within {timeout:g} s on replica(s) {pending}; they were "
            f"interrupted.{detail} Raise the timeout (cluster.strategy.timeout, or timeout=) "
            "for longer work.",
            pending=tuple(pending),
        )
    _print_outputs(parts, engines)
    replies = checked_replies(
        cluster, engines, parts, supervisor, what, fix="cluster.restart()", hints=_notes(fn)
    )
    for info, reply in zip(engines, replies):
        try:
            reply["value"] = _wire.loads(reply["value"])
        except Exception as error:
            raise SerializationError(
                f"The result of replica {info.rank} in {what} cannot be unpickled in the "
                f"notebook: {type(error).__name__}: {error}. Return tensors, numbers or "
                "containers of them."
            ) from error
    return replies


def _submit(
    client: Any,
    engines: Sequence[EngineInfo],
    entry: str,
    payloads: bytes | Sequence[Any],
    extra: tuple,
) -> list[Any]:
    """Send the request; one AsyncResult per engine, in replica order."""
    func = getattr(engine_calls, entry)
    ids = [info.id for info in engines]
    if isinstance(payloads, (bytes, bytearray)):
        result = client.direct_view(ids).apply_async(func, payloads, *extra)
        return list(result.split()) if len(ids) > 1 else [result]
    if len(payloads) != len(engines):
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{len(payloads)} payloads for {len(engines)} engines; pass one payload per engine, "
            "in replica order (or one bytes payload for all of them)."
        )
    return [
        client.direct_view([info.id]).apply_async(func, payload, *extra)
        for info, payload in zip(engines, payloads)
    ]


def reply_of(part: Any) -> Any:
    """One engine's reply dict (or the exception ipyparallel raised) from its AsyncResult."""
    value = part.get(return_exceptions=True)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value


def reply_ok(reply: Any) -> bool:
    """True for a reply of an engine-side entry point that succeeded (`{"ok": True, ...}`)."""
    return isinstance(reply, dict) and bool(reply.get("ok"))


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

    def wait(self, timeout: float | None) -> bool:
        """Wait until every engine answered (True) or `timeout` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [part for part in self.parts if not part.ready()]
            if not pending:
                return True
            now = time.monotonic()
            remaining = None if deadline is None else deadline - now
            if remaining is not None and remaining <= 0:
                return False
            step = remaining
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
        doing = "; ".join(
            f"replica {info.rank}: {_doing(part)}" for info, part in zip(self.engines, self.parts)
        )
        if not pending:
            doing = "every replica had finished"
        return ClusterInterrupted(f"{self.what} interrupted ({doing}). {state}".rstrip())

    def settle(self, fix: str) -> str:
        """Decide the cluster's health after this call (Note [Cluster health]); a sentence."""
        still = self.pending()
        replies = [reply_of(part) if part.ready() else None for part in self.parts]
        died = [
            info.rank
            for info, reply in zip(self.engines, replies)
            if isinstance(reply, BaseException) and _engine_error(reply)
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
                reply.get("ename") in _COLLECTIVE_ERRORS
                or "torch.distributed." in str(reply.get("where") or "")
            )
            for reply in replies
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
                "lost)."
            )
        notes = {
            info.rank: interrupt_note(self.cluster.client, part)
            for info, part in zip(self.engines, self.parts)
            if not part.ready()
        }
        if still and all(notes.get(rank) for rank in still):
            # Running Python, they will come back (Note [Caught interrupts]); the group is
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


_COLLECTIVE_ERRORS = ("CollectiveTimeoutError", "WorkerLostError", "DistBackendError")


def _engine_error(reply: BaseException) -> bool:
    return str(getattr(reply, "ename", None) or type(reply).__name__) == "EngineError"


def _doing(part: Any) -> str:
    """What one engine was doing when interrupted, from its reply (or that it is still busy:
    the cluster's state sentence says more)."""
    if not part.ready():
        return "still busy"
    reply = reply_of(part)
    if isinstance(reply, BaseException):
        return "its engine died" if _engine_error(reply) else f"{type(reply).__name__}"
    if reply_ok(reply):
        return "had finished"
    where = reply.get("where") or ""
    ename = reply.get("ename")
    if ename == "KeyboardInterrupt":
        return f"interrupted {where}".strip()
    return f"{ename} {where}".strip()


def interrupt_note(client: Any, part: Any) -> str | None:
    """What a still-running engine published after catching a `KeyboardInterrupt`
    (`engine_side.guards.interrupt_note`, e.g. "caught the KeyboardInterrupt (raised at line
    3 (...)) and is still running line 6 (...)"), else None."""
    metadata = getattr(client, "metadata", None) or {}
    for msg_id in list(getattr(part, "msg_ids", ())):
        md = metadata.get(msg_id)
        note = (md.get("data") or {}).get(INTERRUPT_KEY) if md is not None else None
        if note:
            return str(note)
    return None


def failure_of(info: EngineInfo, reply: Any) -> RemoteFailure:
    """The `RemoteFailure` of engine `info`, from a failed reply or an ipyparallel error."""
    if isinstance(reply, BaseException):
        ename = str(getattr(reply, "ename", None) or type(reply).__name__)
        evalue = str(getattr(reply, "evalue", None) or reply)
        traceback = str(getattr(reply, "traceback", "") or "")
        if ename == "EngineError":  # its traceback would show the client's internals only
            evalue = f"the engine died or unregistered ({evalue}). Restart: cluster.restart()."
            traceback = ""
        return RemoteFailure(
            replica=info.rank, engine_id=info.id, host=info.host, pid=info.pid, ename=ename,
            evalue=evalue, traceback=traceback,
        )  # fmt: skip
    return RemoteFailure(
        replica=info.rank,
        engine_id=info.id,
        host=info.host,
        pid=info.pid,
        ename=str(reply.get("ename", "Error")),
        evalue=str(reply.get("evalue", "")),
        traceback=cell_names.rename(str(reply.get("traceback", ""))),
        secondary=bool(reply.get("secondary", False)),
        short=None if reply.get("short") is None else cell_names.rename(str(reply["short"])),
        collective=str(reply.get("collective") or ""),
    )


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
    replies = [reply_of(part) for part in parts]
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
        failures = [_after_death(f, died) for f in failures]
    notes = hints(failures) if hints is not None else []
    if state:
        notes.append(state.strip())
    raise RemoteError(what, failures, len(engines), notes)


def fix_stop(fix: str) -> str:
    """How to stop the engines, in the words of `fix` (the notebook's magic or the API)."""
    return "`%dist stop`" if "%dist" in fix else "cluster.stop()"


def _after_death(failure: RemoteFailure, died: list[int]) -> RemoteFailure:
    """`failure`, marked secondary and naming `died` if it came out of a collective."""
    from_collective = failure.ename in _COLLECTIVE_ERRORS or (
        os.path.join("torch", "distributed") in failure.traceback
    )
    if failure.ename == "EngineError" or failure.secondary or not from_collective:
        return failure
    return dataclasses.replace(
        failure,
        secondary=True,
        evalue=f"released from a collective because replica(s) {died} died: {failure.evalue}",
    )


def _notes(fn: Any) -> Callable[[list[RemoteFailure]], list[str]]:
    """Hints whose fix is in the notebook (a name that exists here but not on the engines)."""

    def hints(failures: list[RemoteFailure]) -> list[str]:
        known = getattr(fn, "__globals__", None) if _wire.is_namespace_function(fn) else None
        if not known:
            return []
        for failure in failures:
            if failure.ename != "NameError" or failure.evalue.count("'") < 2:
                continue
            name = failure.evalue.split("'")[1]
            if name in known:
                return [
                    f"Note: {name!r} exists in this notebook but not on the engines; functions "
                    "run there look names up in the engine's namespace. Send it with "
                    f"cluster.push({{{name!r}: {name}}}) or define it on the engines."
                ]
        return []

    return hints


def wait_for_outputs(
    parts: list[Any], engines: Sequence[EngineInfo], timeout_s: float = OUTPUT_WAIT_S
) -> list[int]:
    """Wait, `timeout_s` at most in all, until what every answered engine printed is here.

    Returns the replicas whose output is still incomplete (their last lines may be missing).

    Note [Output after the reply]: an engine's reply and what it printed travel separately
    (the reply through the controller's scheduler, the output through its iopub relay), so the
    reply often comes first. On a loaded machine the output can follow more than a second
    later (a cell's printed lines went missing on a 2-core CI machine running tests in
    parallel, while this waited 1 s per engine and then printed what it had). The wait ends
    as soon as the output is complete, so it costs nothing when output is on time; an engine
    that died or never answered is not waited for (ipyparallel completes a dead engine's
    output itself).

    Example:
        >>> wait_for_outputs([], [])
        []
    """
    deadline = time.monotonic() + timeout_s
    late = []
    for info, part in zip(engines, parts):
        if not part.ready():
            continue
        try:
            complete = part.wait_for_output(max(0.0, deadline - time.monotonic()))
        except Exception:  # a result that cannot say: nothing more will come for it
            complete = True
        if not complete:
            late.append(info.rank)
    return late


def say_late_output(late: list[int]) -> None:
    """One line on stderr naming the replicas whose output did not arrive in time."""
    if late:
        print(
            f"[nbdist] the output of replica(s) {late} was still arriving "
            f"{OUTPUT_WAIT_S:g} s after their results; lines they printed last may be missing.",
            file=sys.stderr,
        )


def _print_outputs(parts: list[Any], engines: Sequence[EngineInfo]) -> None:
    """Print what each engine printed, prefixed by its replica id."""
    late = wait_for_outputs(parts, engines)
    for info, part in zip(engines, parts):
        for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
            try:
                text = getattr(part, name)
            except Exception:
                continue
            if isinstance(text, list):
                text = "".join(t or "" for t in text)
            for line in (text or "").splitlines():
                print(f"[replica {info.rank}] {line}", file=stream)
    say_late_output(late)
