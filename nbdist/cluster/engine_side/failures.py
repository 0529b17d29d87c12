"""Failure replies from the engine: what failed, where the user's code was, and whether it is
merely a consequence of another replica's failure.

Runs on the engine (the entry points of `calls` and `%%distribute`'s `cell.run_cell`
reply with `failure_reply` instead of raising), because only the engine has the traceback and
knows its process group's state. The notebook only shows the reply (`RemoteError`).

Example (on an engine)::

    try:
        1 / 0
    except ZeroDivisionError as error:
        reply = failure_reply(error, "cell")    # {"ok": False, "ename": ..., "where": ...}
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from nbdist.cluster import _wire
from nbdist.cluster.engine_side import state
from nbdist.cluster.engine_side.user_code import is_user_file

__all__ = ["failure_reply", "user_traceback", "where"]

_RAW_CALL = re.compile(r"in torch\.distributed\.(\w+)")
_NBDIST_COLLECTIVE = re.compile(r"^(?:\[replica \d+ of \d+\] )?(\S+) on rank \d+ of \d+ ")


def failure_reply(error: BaseException, stage: str) -> dict[str, Any]:
    """`_failure_reply`, plus what the notebook shows first (Note [The cause first] in
    `nbdist.cluster.errors`): `short`, the user's frames of the traceback, and for a
    replica released because a peer failed, `collective`, the call it was released from."""
    from nbdist.cluster.engine_side.debugger import remember_failure

    remember_failure(error)  # for `%dist debug`
    reply = _failure_reply(error, stage)
    reply["short"] = user_traceback(error)
    if reply.get("secondary"):
        reply["collective"] = _collective(reply)
    return reply


def user_traceback(error: BaseException) -> str:
    """`error`'s traceback with the user's frames only, without its last line (the error and
    its message, which the notebook prints after it with the replicas that raised it): no
    frame of nbdist, torch, ipyparallel or IPython, no chained library error (gloo's
    "Connection closed by peer ..." stays in the full traceback). Empty when no frame is the
    user's. nbdist's frames stay with `NBDIST_SHOW_INTERNAL_FRAMES=1`.

    Example (on an engine)::

        user_traceback(error)
        # 'Traceback (most recent call last):\n  File "<distribute-cell-1>", line 3, ...'
    """
    import traceback as traceback_module

    frames = [
        frame
        for frame in traceback_module.extract_tb(error.__traceback__)
        if is_user_file(frame.filename)
    ]
    text = "".join(traceback_module.format_list(frames))
    return f"Traceback (most recent call last):\n{text}" if text else ""


def _collective(reply: dict[str, Any]) -> str:
    """The collective a released replica waited in: `all_reduce:SUM #12` (nbdist's, numbered
    in this group), `torch.distributed.all_reduce` (the user's own call), or ``."""
    named = _NBDIST_COLLECTIVE.match(str(reply.get("evalue") or ""))
    if named:
        group = state.group()
        number = getattr(group, "entered", None) if group is not None else None
        return f"{named.group(1)} #{number}" if number else named.group(1)
    raw = _RAW_CALL.search(str(reply.get("where") or ""))
    return f"torch.distributed.{raw.group(1)}" if raw else ""


def _failure_reply(error: BaseException, stage: str) -> dict[str, Any]:
    """`_wire.failure`, knowing one more consequence: a `torch.distributed` call the user made
    directly that failed because a peer that failed left the group (Note [Raw collectives] in
    `nbdist.collectives.torch_dist`) is secondary, and its message names that peer."""
    from nbdist.cluster.engine_side.guards import group_destroyed, noting_the_group
    from nbdist.collectives.torch_dist import raised_in_torch_distributed

    reply = noting_the_group(_wire.failure(error, stage))
    reply["where"] = where(error)
    if group_destroyed() and raised_in_torch_distributed(error):
        return _group_destroyed(reply, error)
    if reply["secondary"]:
        return reply
    group = state.group()
    if group is None or not raised_in_torch_distributed(error):
        return reply
    abandoned = group.abandoned
    if abandoned is not None:
        reason, _, secondary = abandoned
        reply["secondary"] = secondary
        reply["evalue"] = (
            f"released from a torch.distributed call: {reason}; the process group was "
            f"abandoned. Original error: {reply['evalue']}"
        )
        return reply
    with contextlib.suppress(Exception):
        failures = group.peer_failures()
        if failures:
            rank, message = min(failures.items())
            reply["secondary"] = True
            reply["evalue"] = (
                f"released from a torch.distributed call because replica {rank} failed "
                f"({message}); the process group is unusable until a restart. Original error: "
                f"{reply['evalue']}"
            )
    return reply


def _group_destroyed(reply: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """`reply` for a `torch.distributed` call that failed because user code destroyed the
    group: a `ContextError` naming that and the fix, with the user's frames only."""
    import traceback as traceback_module

    from nbdist.cluster.engine_side.guards import GROUP_DESTROYED

    library = f"{os.sep}torch{os.sep}"
    frames = [
        frame
        for frame in traceback_module.extract_tb(error.__traceback__)
        if not _wire.is_internal(frame.filename) and library not in frame.filename
    ]
    text = "".join(traceback_module.format_list(frames))
    reply.update(
        ename="ContextError",
        evalue=GROUP_DESTROYED,
        secondary=False,
        traceback=(f"Traceback (most recent call last):\n{text}" if text else "")
        + f"nbdist.errors.ContextError: {GROUP_DESTROYED}\n",
    )
    return reply


def where(error: BaseException) -> str:
    """Where the user's code was when `error` was raised, in a few words: the innermost frame
    outside nbdist, torch and ipyparallel (a cell's line with its source), and the
    `torch.distributed` function it was in, if any.

    Example: `"at line 3 (dist.recv(t, src=1)), in torch.distributed.recv"`.
    """
    import traceback as traceback_module

    from nbdist.collectives.liveness import C10D_FILE

    frames = traceback_module.extract_tb(error.__traceback__)
    library = f"{os.sep}torch{os.sep}"
    user = [f for f in frames if not _wire.is_internal(f.filename) and library not in f.filename]
    text = ""
    if user:
        frame = user[-1]
        source = (frame.line or "").strip()
        text = f"at line {frame.lineno}" + (f" ({source[:60]})" if source else "")
    inside = [f for f in frames if f.filename.endswith(C10D_FILE)]
    if inside:
        text += f", in torch.distributed.{inside[-1].name}"
    return text.lstrip(", ")
