"""The notebook's half of `cluster.stacks()`: ask every engine's stack server at once.

Each engine runs a stack server (`engine_side.stacks`) that answers from its own thread while
a cell runs; this module connects to all of them concurrently, with one deadline, and turns
the answers into `nd.debug.ReplicaStack`s. An engine whose process is gone is `"dead"`, one
that does not answer in time `"no answer"`; the others are shown either way. Nothing on
the engines changes.

Example::

    for stack in stacks(cluster.engines, timeout=2.0):
        print(stack.replica, stack.state, stack.collective)
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from nbdist.cluster.status import EngineInfo
from nbdist.debug.stacks import ReplicaStack

__all__ = ["ask_engines", "collective_records", "stacks"]

_REPLY_LIMIT = 64 * 1024 * 1024


def stacks(engines: Sequence[EngineInfo], timeout: float = 2.0) -> list[ReplicaStack]:
    """Every engine's live stacks (one `ReplicaStack` each, in replica order)."""
    answers = ask_engines(engines, "stacks", timeout)
    out = []
    for engine in engines:
        reply, problem = answers[engine.rank]
        if reply is None:
            state = "dead" if problem == "dead" else "no answer"
            note = problem if problem not in ("dead",) else "its process is gone"
            out.append(ReplicaStack(engine.rank, engine.host, engine.pid, state, note=note))
            continue
        threads = {name: [tuple(f) for f in frames] for name, frames in reply["threads"].items()}
        collective = reply.get("collective")
        if collective and collective.get("end") is None and collective.get("start"):
            collective["waiting_s"] = max(0.0, float(reply["time"]) - collective["start"])
        out.append(ReplicaStack(engine.rank, engine.host, engine.pid, "running",
                                threads, collective))  # fmt: skip
    return out


def collective_records(
    engines: Sequence[EngineInfo], timeout: float = 2.0
) -> dict[int, list[dict[str, Any]]]:
    """Every answering engine's collective recorder entries: `{replica: entries}`.

    The process group's current generation; when no replica has recorded anything in it yet
    (the group was formed again after a failure), the generation before, which holds the
    failure's collectives."""
    answers = ask_engines(engines, "collectives", timeout)
    replies = {rank: reply for rank, (reply, _) in sorted(answers.items()) if reply is not None}
    if not any(reply["entries"] for reply in replies.values()):
        replies = {r: reply.get("previous") or {"entries": []} for r, reply in replies.items()}
    return {
        rank: [dict(e, shape=_tuple(e.get("shape"))) for e in reply["entries"]]
        for rank, reply in replies.items()
    }


def ask_engines(
    engines: Sequence[EngineInfo], what: str, timeout: float
) -> dict[int, tuple[dict | None, str]]:
    """`{rank: (reply, problem)}` from every engine's stack server, asked concurrently;
    `problem` says why a reply is None (`"dead"`, or the reason it did not answer)."""
    deadline = time.monotonic() + timeout
    answers: dict[int, tuple[dict | None, str]] = {}

    def ask(engine: EngineInfo) -> None:
        answers[engine.rank] = _ask(engine, what, deadline, timeout)

    threads = [threading.Thread(target=ask, args=(e,), daemon=True) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 0.2)
    for engine in engines:
        answers.setdefault(engine.rank, (None, f"did not answer within {timeout:g} s"))
    return dict(answers)


def _ask(engine: EngineInfo, what: str, deadline: float, timeout: float) -> tuple:
    if engine.stacks is None:
        return None, "its engine has no stack server (started by an older nbdist)"
    address, port, token = engine.stacks
    try:
        with socket.create_connection(
            (address, port), timeout=max(0.05, deadline - time.monotonic())
        ) as sock:
            sock.sendall(f"{token} {what}\n".encode())
            chunks = []
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                if sum(map(len, chunks)) > _REPLY_LIMIT:
                    return None, "its answer was too large"
        return json.loads(b"".join(chunks)), ""
    except (ConnectionRefusedError, ConnectionResetError):
        return None, "dead" if not _alive(engine) else "its stack server is closed"
    except TimeoutError:
        if not _alive(engine):
            return None, "dead"
        return None, f"did not answer within {timeout:g} s"
    except (OSError, ValueError) as error:
        return None, "dead" if not _alive(engine) else f"no answer ({error})"


def _alive(engine: EngineInfo) -> bool:
    """False when the engine's process is known to be gone (local engines only)."""
    if engine.host != socket.gethostname():
        return True  # cannot tell from here
    try:
        os.kill(engine.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return not _zombie(engine.pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _tuple(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuple(v) for v in value)
    return value
