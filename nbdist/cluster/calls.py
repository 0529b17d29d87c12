"""Calling every engine at once and waiting for them: `call_engines`.

One request goes to every engine (`DirectView.apply`, or one apply per engine when their
arguments differ). While waiting, a supervisor watches for the situation a process group cannot
get out of by itself: an engine whose function failed is idle again, but its peers are blocked
in a collective it will never join. Gloo waits in C++, where neither the failed engine's error
notice nor SIGINT reaches them, until the collective timeout (300 s by default). Note [Releasing
blocked peers]: the supervisor asks each failed engine whether peers have entered more
collectives than it has (their heartbeats say so); if they have, that engine publishes its
failure and leaves the process group, which fails the peers' pending collectives at once with
an error naming it. The group is then unusable (as after any failed collective) and the
cluster is marked broken until `restart()`.

Timeouts and Ctrl-C interrupt the engines still running (SIGINT through ipyparallel's nanny),
then give them a few seconds to come back, releasing blocked peers the same way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist.cluster import _engine_side, _wire
from nbdist.cluster.errors import (
    EngineTimeoutError,
    RemoteError,
    RemoteFailure,
    SerializationError,
)
from nbdist.cluster.status import EngineInfo

if TYPE_CHECKING:
    from nbdist.cluster.engines import Cluster

__all__ = [
    "INTERRUPT_GRACE_S",
    "Supervisor",
    "call_engines",
    "checked_replies",
    "failure_of",
    "reply_of",
    "reply_ok",
]

INTERRUPT_GRACE_S = 10.0
"""Seconds interrupted engines get to come back before they count as still busy."""
_RECHECK_S = 1.0
_RELEASE_TIMEOUT_S = 10.0


def call_engines(
    cluster: Cluster,
    entry: str,
    payloads: bytes | Sequence[Any],
    *extra: Any,
    timeout: float | None,
    what: str,
    fn: Any = None,
) -> list[dict[str, Any]]:
    """Call `_engine_side.<entry>(payload, *extra)` on every engine; replies in replica order.

    Args:
        cluster: A running cluster.
        entry: The name of a function of `_engine_side` that returns a reply dict.
        payloads: One payload for every engine, or a list with one per engine.
        extra: More arguments, the same for every engine.
        timeout: Seconds to wait (None: no limit).
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
        finished = supervisor.wait(timeout)
    except KeyboardInterrupt:
        supervisor.interrupt()
        supervisor.wait(INTERRUPT_GRACE_S)  # a second Ctrl-C stops waiting at once
        raise
    if not finished:
        pending, detail = supervisor.interrupt_after_timeout("cluster.restart()")
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
    func = getattr(_engine_side, entry)
    ids = [info.id for info in engines]
    if isinstance(payloads, (bytes, bytearray)):
        result = client.direct_view(ids).apply_async(func, payloads, *extra)
        return list(result.split()) if len(ids) > 1 else [result]
    if len(payloads) != len(engines):
        raise ValueError(f"{len(payloads)} payloads for {len(engines)} engines.")
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
    """Waits for one call on every engine; releases peers blocked by a failed engine."""

    def __init__(self, cluster: Cluster, engines: Sequence[EngineInfo], parts: list[Any], what):
        self.cluster = cluster
        self.engines = list(engines)
        self.parts = parts
        self.what = what
        self.released: list[int] = []

    def wait(self, timeout: float | None) -> bool:
        """Wait until every engine answered (True) or `timeout` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [part for part in self.parts if not part.ready()]
            if not pending:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            failed = self._failed_and_idle()
            if failed and not self.released:
                self._release(failed)
            step = remaining
            if failed and not self.released:  # peers' heartbeats may lag: look again soon
                step = _RECHECK_S if step is None else min(step, _RECHECK_S)
            concurrent.futures.wait(
                pending, timeout=step, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def interrupt(self) -> list[int]:
        """SIGINT the engines still running; their replica ids."""
        pending = [info for info, part in zip(self.engines, self.parts) if not part.ready()]
        if pending:
            with contextlib.suppress(Exception):
                self.cluster.client.send_signal(
                    signal.SIGINT, targets=[info.id for info in pending], block=False
                )
        return [info.rank for info in pending]

    def interrupt_after_timeout(self, fix: str) -> tuple[list[int], str]:
        """Interrupt the engines still running, give them `INTERRUPT_GRACE_S` to come back;
        their replica ids, and a sentence on their state naming `fix` where needed."""
        pending = self.interrupt()
        self.wait(INTERRUPT_GRACE_S)
        still = [info.rank for info, part in zip(self.engines, self.parts) if not part.ready()]
        detail = (
            f" Replica(s) {still} are still busy (blocked outside Python, e.g. in a collective "
            f"whose peer is gone); run {fix}."
            if still
            else " They are usable again."
        )
        if self.released:
            detail += (
                f" Replica(s) {self.released} left the process group to release peers blocked "
                f"in a collective; run {fix} before running collectives again."
            )
        return pending, detail

    def _failed_and_idle(self) -> list[tuple[EngineInfo, Any]]:
        return [
            (info, reply_of(part))
            for info, part in zip(self.engines, self.parts)
            if part.ready() and not reply_ok(reply_of(part))
        ]

    def _release(self, failed: list[tuple[EngineInfo, Any]]) -> None:
        """Note [Releasing blocked peers]: ask the failed engines to leave the group if needed."""
        client = self.cluster.client
        for info, reply in failed:
            if isinstance(reply, BaseException):
                continue  # the engine died: its peers' collectives fail by themselves
            reason = f"{reply.get('ename')}: {reply.get('evalue')} (in {self.what})"
            try:
                answer = (
                    client.direct_view([info.id])
                    .apply_async(_engine_side.release_peers, reason)
                    .get(timeout=_RELEASE_TIMEOUT_S)
                )
            except Exception:
                continue
            answer = answer[0] if isinstance(answer, list) else answer
            if answer.get("left"):
                self.released.append(info.rank)
                exits = (
                    "; its engine exits to release them from a torch.distributed call of "
                    "their own"
                    if answer.get("exiting")
                    else ""
                )
                self.cluster.mark_broken(
                    f"replica {info.rank} failed in {self.what} and left the process group to "
                    f"release replica(s) {answer.get('waiting')} blocked in a collective{exits}"
                )


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
        traceback=str(reply.get("traceback", "")),
        secondary=bool(reply.get("secondary", False)),
    )


def checked_replies(
    cluster: Cluster,
    engines: Sequence[EngineInfo],
    parts: list[Any],
    supervisor: Supervisor,
    what: str,
    *,
    fix: str,
    hints: Callable[[list[RemoteFailure]], list[str]] | None = None,
) -> list[Any]:
    """The engines' replies, in replica order, once all have answered; one `RemoteError` for
    all failed replicas otherwise, with notes on dead engines and a released group naming
    `fix` (e.g. `"cluster.restart()"`), plus whatever `hints(failures)` adds. An engine that
    died marks the cluster broken."""
    replies = [reply_of(part) for part in parts]
    failures = [
        failure_of(info, reply) for info, reply in zip(engines, replies) if not reply_ok(reply)
    ]
    died = [f.replica for f in failures if f.ename == "EngineError"]
    if died:
        cluster.mark_broken(f"the engine(s) of replica(s) {died} died during {what}")
    if not failures:
        return replies
    notes = hints(failures) if hints is not None else []
    if died:
        notes.append(f"Replica(s) {died} died: run {fix} (engine state is lost).")
    if supervisor.released:
        notes.append(
            f"Replica(s) {supervisor.released} left the process group to release peers "
            f"blocked in a collective; the group is unusable now. Run {fix} before running "
            "collectives again."
        )
    raise RemoteError(what, failures, len(engines), notes)


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


def _print_outputs(parts: list[Any], engines: Sequence[EngineInfo]) -> None:
    """Print what each engine printed, prefixed by its replica id."""
    for info, part in zip(engines, parts):
        with contextlib.suppress(Exception):
            part.wait_for_output(1.0)
        for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
            try:
                text = getattr(part, name)
            except Exception:
                continue
            if isinstance(text, list):
                text = "".join(t or "" for t in text)
            for line in (text or "").splitlines():
                print(f"[replica {info.rank}] {line}", file=stream)
