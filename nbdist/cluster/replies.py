"""Reading the engines' replies: what an entry point answered, and what a failure says.

Every engine-side entry point (`engine_side.calls`, `engine_side.cell`) answers with a dict,
`{"ok": True, "value": pickled, ...}` or a failure reply (`_wire.failure`); ipyparallel answers
for an engine that died with an exception instead. These helpers turn either into what the
notebook reports (`RemoteFailure`), and say what an interrupted engine was doing.

Example:
    >>> reply_ok({"ok": True, "value": b""}), reply_ok({"ok": False})
    (True, False)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from nbdist.cluster import cell_names
from nbdist.cluster.engine_side.guards import INTERRUPT_KEY
from nbdist.cluster.errors import RemoteFailure
from nbdist.cluster.status import EngineInfo

__all__ = [
    "COLLECTIVE_ERRORS",
    "after_death",
    "doing",
    "engine_error",
    "failure_of",
    "fix_stop",
    "interrupt_note",
    "reply_of",
    "reply_ok",
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


COLLECTIVE_ERRORS = ("CollectiveTimeoutError", "WorkerLostError", "DistBackendError")
"""Error names of a failed collective (nbdist's own, or torch.distributed's)."""


def engine_error(reply: BaseException) -> bool:
    """True for ipyparallel's report of an engine that died or unregistered."""
    return str(getattr(reply, "ename", None) or type(reply).__name__) == "EngineError"


def doing(part: Any) -> str:
    """What one engine was doing when interrupted, from its reply (or that it is still busy:
    the cluster's state sentence says more)."""
    if not part.ready():
        return "still busy"
    reply = reply_of(part)
    if isinstance(reply, BaseException):
        return "its engine died" if engine_error(reply) else f"{type(reply).__name__}"
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


def fix_stop(fix: str) -> str:
    """How to stop the engines, in the words of `fix` (the notebook's magic or the API)."""
    return "`%dist stop`" if "%dist" in fix else "cluster.stop()"


def after_death(failure: RemoteFailure, died: list[int]) -> RemoteFailure:
    """`failure`, marked secondary and naming `died` if it came out of a collective."""
    from_collective = failure.ename in COLLECTIVE_ERRORS or (
        os.path.join("torch", "distributed") in failure.traceback
    )
    if failure.ename == "EngineError" or failure.secondary or not from_collective:
        return failure
    return dataclasses.replace(
        failure,
        secondary=True,
        evalue=f"released from a collective because replica(s) {died} died: {failure.evalue}",
    )
