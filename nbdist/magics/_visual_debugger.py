"""JupyterLab's visual debugger on replicas: the notebook kernel's half.

Note [The visual debugger on replicas]: JupyterLab speaks the Debug Adapter Protocol (DAP) to
the notebook's kernel (`debug_request` on the control channel), and ipykernel answers it with
debugpy in its own process (`ipykernel.debugger.Debugger`), which never sees a `%%distribute`
cell's frames: they run on the engines. `install` puts a `VisualDebugger` in front of the
kernel's debugger (`kernel.debugger`, which `do_debug_request` asks); it answers the requests
about replicas and hands every other one on unchanged:

- `setBreakpoints` is recorded (and handed on): the lines JupyterLab sets in a cell's file
  (ipykernel names it by a hash of the cell's text, `dumpCell`). A `%%distribute` cell run
  while the debugger is on sends its lines to the engines (`breakpoints_for`), which stop
  there (`engine_side.dap`).
- A stopped replica is a DAP thread named `replica N` (id `THREAD_BASE + N`): a `stopped`
  event when it stops, in `threads` besides the kernel's own threads, in `debugInfo`'s
  `stoppedThreads`.
- `stackTrace` of a replica's thread lists its frames first (named `replica N: <function>`,
  in the cell's file, so JupyterLab marks the line in the cell), then the frames of the other
  stopped replicas: JupyterLab 4 shows one thread (the last that stopped), and clicking a
  frame of replica M in the Callstack panel shows replica M's variables and makes M the
  chosen replica.
- `scopes`, `variables`, `evaluate` about those frames are answered from the replica.
- `next`, `stepIn`, `stepOut` act on the chosen replica (the one whose frame the Variables
  panel shows); `continue` continues every stopped replica (DAP's default), or only the
  chosen one with `singleThread`.
- `disconnect` (the debugger switched off) forgets the breakpoints on the replicas and
  continues them.

Example (what `%load_ext nbdist` does in a kernel)::

    install(get_ipython())
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import socket
import threading
from typing import Any

__all__ = ["THREAD_BASE", "VisualDebugger", "breakpoints_for", "install", "uninstall"]

THREAD_BASE = 1 << 20
"""Replica N's DAP thread id is `THREAD_BASE + N` (debugpy numbers its threads from 1)."""
_ANSWER_S = 5.0
_IDS_FROM = 1 << 30  # frame ids and variable refs of replicas (debugpy's are small)
_STEPS = {"next": "n", "stepIn": "s", "stepOut": "r"}
_installed: dict[int, VisualDebugger] = {}


class _Refused(Exception):
    """A request about a replica that cannot be answered (the text says why)."""


def install(shell: Any) -> VisualDebugger | None:
    """Put a `VisualDebugger` in front of the debugger of `shell`'s kernel (once); None when
    the shell has no kernel or the kernel no debugger (debugpy is missing)."""
    kernel = getattr(shell, "kernel", None)
    inner = getattr(kernel, "debugger", None)
    if kernel is None or inner is None:
        return None
    if isinstance(inner, VisualDebugger):
        return inner
    from nbdist.cluster import debug_prompt

    bridge = VisualDebugger(inner, kernel)
    kernel.debugger = bridge
    debug_prompt.visual_debugger.append(bridge.adopt)
    _installed[id(shell)] = bridge
    return bridge


def uninstall(shell: Any) -> None:
    """Undo `install` (continuing any replica still stopped)."""
    from nbdist.cluster import debug_prompt

    bridge = _installed.pop(id(shell), None)
    if bridge is None:
        return
    bridge.release()
    if bridge.adopt in debug_prompt.visual_debugger:
        debug_prompt.visual_debugger.remove(bridge.adopt)
    if getattr(bridge.kernel, "debugger", None) is bridge:
        bridge.kernel.debugger = bridge.inner


def breakpoints_for(shell: Any, filename: str, cell: str) -> list[int]:
    """The lines of JupyterLab's breakpoints in the cell the kernel runs now, when `cell`
    (the `%%distribute` body about to run as `filename` on the engines) is that cell's;
    [] without the visual debugger. Frames in `filename` are then shown in the cell."""
    bridge = _installed.get(id(shell))
    if bridge is None or not bridge.is_started:
        return []
    try:
        parent = bridge.kernel.get_parent("shell")
        raw = str(parent["content"]["code"])
    except Exception:
        return []
    if cell.strip() not in raw:
        return []  # `distribute_cell` called from code, not this cell's own body
    from ipykernel.compiler import get_file_name

    path = get_file_name(raw)
    bridge.cells[filename] = path
    return sorted(bridge.breaks.get(path, ()))


class _Replica:
    """One stopped (or once stopped) replica's connection to its engine's pdb."""

    def __init__(self, rank: int, connection: socket.socket):
        self.rank = rank
        self.connection = connection
        self.state = "running"  # running | stopped | done
        self.stops = 0
        self.last = "c"
        self.answers: dict[int, Any] = {}
        self.changed = threading.Condition()
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.connection.sendall((json.dumps(message) + "\n").encode())
        except OSError as error:
            raise _Refused(f"replica {self.rank} has left the debugger ({error})") from None


class VisualDebugger:
    """ipykernel's `Debugger` (`inner`) with the replicas of `%%distribute` cells added (see
    the module docstring); what it does not answer goes to `inner`."""

    def __init__(self, inner: Any, kernel: Any):
        self.inner = inner
        self.kernel = kernel
        self.breaks: dict[str, list[int]] = {}
        """JupyterLab's breakpoints: `{cell file: lines}`."""
        self.cells: dict[str, str] = {}
        """`{engine file of a %%distribute cell: the kernel's file of that cell}`."""
        self.replicas: dict[int, _Replica] = {}
        self.chosen: int | None = None
        self._frames: dict[int, tuple[int, int, int]] = {}  # id -> (rank, stop, index)
        self._refs: dict[int, tuple[int, int, int]] = {}  # ref -> (rank, stop, engine ref)
        self._ids = itertools.count(_IDS_FROM)
        self._queries = itertools.count(1)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def __getattr__(self, name: str) -> Any:  # the rest of ipykernel's Debugger
        return getattr(self.inner, name)

    # -- the replicas' connections (a thread) -------------------------------------------------
    def adopt(self, rank: int, connection: socket.socket) -> None:
        """A replica stopped at a breakpoint of the visual debugger: its pdb is at the end of
        `connection` (called by `debug_prompt.DebugConsole`'s watch thread)."""
        with self._lock:
            old = self.replicas.get(rank)
            self.replicas[rank] = _Replica(rank, connection)
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(
                    target=self._read, name="nbdist-visual-debugger", daemon=True
                )
                self._reader.start()
        if old is not None:
            with contextlib.suppress(OSError):
                old.connection.close()

    def _read(self) -> None:
        while True:
            with self._lock:
                live = {r.connection: r for r in self.replicas.values() if r.state != "done"}
            if not live:
                return
            try:
                ready, _, _ = select.select(list(live), [], [], 0.2)
            except (OSError, ValueError):
                ready = [c for c in live if c.fileno() < 0]
            for connection in ready:
                replica = live[connection]
                try:
                    chunk = connection.recv(1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    self._ended(replica)
                    continue
                replica.buffer += chunk
                while b"\n" in replica.buffer:
                    line, replica.buffer = replica.buffer.split(b"\n", 1)
                    with contextlib.suppress(ValueError):
                        self._handle(replica, json.loads(line))

    def _handle(self, replica: _Replica, message: dict[str, Any]) -> None:
        if "answer" in message:
            with replica.changed:
                replica.answers[int(message.get("id") or 0)] = message["answer"]
                replica.changed.notify_all()
        if "ask" in message:
            with replica.changed:
                replica.state = "stopped"
                replica.stops += 1
                replica.changed.notify_all()
            self.chosen = replica.rank
            reason = "step" if replica.last in ("n", "s", "r") else "breakpoint"
            self._event(
                "stopped",
                {"reason": reason, "threadId": THREAD_BASE + replica.rank,
                 "allThreadsStopped": False, "description": f"replica {replica.rank}"},
            )  # fmt: skip
        if "done" in message:
            self._ended(replica)

    def _ended(self, replica: _Replica) -> None:
        with replica.changed:
            if replica.state == "done":
                return
            replica.state = "done"
            replica.changed.notify_all()
        with contextlib.suppress(OSError):
            replica.connection.close()
        self._event("thread", {"reason": "exited", "threadId": THREAD_BASE + replica.rank})

    def _event(self, event: str, body: dict[str, Any]) -> None:
        message = {"seq": next(self._seq), "type": "event", "event": event, "body": body}
        with contextlib.suppress(Exception):
            self.inner.event_callback(message)

    # -- DAP requests (the kernel's control thread) -----------------------------------------------
    async def process_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Answer a DAP request about replicas; hand any other to ipykernel's debugger."""
        command = message.get("command")
        arguments = message.get("arguments") or {}
        try:
            body = self._about_replicas(command, arguments)
        except _Refused as refused:
            return _response(message, False, message=str(refused))
        if body is not None:
            return _response(message, True, body)
        if command == "setBreakpoints":
            path = str(arguments.get("source", {}).get("path", ""))
            self.breaks[path] = [int(b["line"]) for b in arguments.get("breakpoints", ())]
        if command == "disconnect":
            self.release()
        reply = await self.inner.process_request(message)
        stopped = self._stopped()
        if command == "threads":
            if not reply:  # the debugger is not started: only the replicas
                reply = _response(message, True, {"threads": []})
            threads = reply.setdefault("body", {}).setdefault("threads", [])
            threads.extend({"id": THREAD_BASE + r, "name": f"replica {r}"} for r in stopped)
        if command == "debugInfo" and reply.get("body") is not None:
            reply["body"]["stoppedThreads"] = list(reply["body"].get("stoppedThreads", [])) + [
                THREAD_BASE + r for r in stopped
            ]
        return reply

    def _about_replicas(self, command: Any, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """The body of the response to a request about replicas; None: not about them."""
        thread = arguments.get("threadId")
        rank = thread - THREAD_BASE if isinstance(thread, int) and thread >= THREAD_BASE else None
        if command == "stackTrace" and rank is not None:
            return self._stack(rank)
        if command == "scopes" and arguments.get("frameId") in self._frames:
            return self._scopes(int(arguments["frameId"]))
        if command == "variables" and arguments.get("variablesReference") in self._refs:
            return self._variables(int(arguments["variablesReference"]))
        if command == "evaluate" and arguments.get("frameId") in self._frames:
            return self._evaluate(int(arguments["frameId"]), str(arguments.get("expression")))
        if (
            command == "continue"
            and rank is None
            and self._stopped()
            and not self._kernel_stopped()
        ):
            rank = self._stopped()[0]  # JupyterLab 4 sends thread 1 once it forgot the replica
        if command == "continue" and rank is not None:
            single = bool(arguments.get("singleThread"))
            targets = [self._target(rank)] if single else self._stopped()
            for target in targets:
                self._command(target, "c")
            return {"allThreadsContinued": not single}
        if command in _STEPS and rank is not None:
            self._command(self._target(rank), _STEPS[command])
            return {}
        if command == "pause" and rank is not None:
            raise _Refused(
                "A running replica cannot be paused from the debugger; set a breakpoint in the "
                "cell (or call breakpoint() in it), or see where every replica is with "
                "`%dist stack`."
            )
        return None

    def _kernel_stopped(self) -> bool:
        """True when debugpy holds a thread of the kernel's own process."""
        return bool(getattr(self.inner, "stopped_threads", None))

    def _stopped(self) -> list[int]:
        with self._lock:
            return sorted(r for r, s in self.replicas.items() if s.state == "stopped")

    def _target(self, rank: int) -> int:
        """The chosen replica if it is stopped, else `rank` (the thread asked about)."""
        return self.chosen if self.chosen in self._stopped() else rank

    def _replica(self, rank: int) -> _Replica:
        replica = self.replicas.get(rank)
        if replica is None or replica.state != "stopped":
            raise _Refused(f"replica {rank} is not stopped in the debugger")
        return replica

    def _query(self, rank: int, query: dict[str, Any], stop: int | None = None) -> Any:
        replica = self._replica(rank)
        if stop is not None and stop != replica.stops:
            raise _Refused(f"replica {rank} has moved on since; look at its new frames")
        ident = next(self._queries)
        replica.send({"query": query, "id": ident})
        with replica.changed:
            answered = replica.changed.wait_for(
                lambda: ident in replica.answers or replica.state != "stopped", _ANSWER_S
            )
            answer = replica.answers.pop(ident, None)
        if not answered or (answer is None and replica.state != "stopped"):
            raise _Refused(f"replica {rank} did not answer within {_ANSWER_S:g} s")
        if isinstance(answer, dict) and "error" in answer:
            raise _Refused(f"replica {rank}: {answer['error']}")
        return answer

    def _command(self, rank: int, line: str) -> None:
        replica = self._replica(rank)
        replica.last = line
        with replica.changed:
            replica.state = "running"
        replica.send({"line": line})

    def _stack(self, rank: int) -> dict[str, Any]:
        frames = []
        for each in [rank] + [r for r in self._stopped() if r != rank]:
            replica = self._replica(each)
            for frame in self._query(each, {"q": "stack"}):
                ident = next(self._ids)
                self._frames[ident] = (each, replica.stops, int(frame["index"]))
                path = self.cells.get(frame["file"], frame["file"])
                frames.append({
                    "id": ident, "name": f"replica {each}: {frame['name']}",
                    "line": int(frame["line"]), "column": 1,
                    "source": {"path": path, "name": os.path.basename(path)},
                })  # fmt: skip
        return {"stackFrames": frames, "totalFrames": len(frames)}

    def _scopes(self, ident: int) -> dict[str, Any]:
        rank, stop, index = self._frames[ident]
        scopes = self._query(rank, {"q": "scopes", "frame": index}, stop)
        self.chosen = rank  # the Variables panel shows this replica: step it
        return {"scopes": [
            {"name": s["name"], "variablesReference": self._ref(rank, stop, s["ref"]),
             "expensive": False} for s in scopes
        ]}  # fmt: skip

    def _variables(self, ref: int) -> dict[str, Any]:
        rank, stop, engine_ref = self._refs[ref]
        found = self._query(rank, {"q": "variables", "ref": engine_ref}, stop)
        return {"variables": [self._variable(rank, stop, v) for v in found]}

    def _evaluate(self, ident: int, expression: str) -> dict[str, Any]:
        rank, stop, index = self._frames[ident]
        found = self._query(rank, {"q": "evaluate", "frame": index, "expression": expression}, stop)
        variable = self._variable(rank, stop, found)
        return {"result": variable["value"], "type": variable["type"],
                "variablesReference": variable["variablesReference"]}  # fmt: skip

    def _variable(self, rank: int, stop: int, found: dict[str, Any]) -> dict[str, Any]:
        ref = self._ref(rank, stop, found["ref"]) if found.get("ref") else 0
        return {"name": found["name"], "value": found["value"], "type": found["type"],
                "evaluateName": found["name"], "variablesReference": ref}  # fmt: skip

    def _ref(self, rank: int, stop: int, engine_ref: int) -> int:
        ident = next(self._ids)
        self._refs[ident] = (rank, stop, engine_ref)
        return ident

    def release(self) -> None:
        """Forget the breakpoints; every stopped replica forgets them too and goes on."""
        self.breaks.clear()
        for rank in self._stopped():
            with contextlib.suppress(_Refused):
                self._query(rank, {"q": "release"})
                self._command(rank, "c")


def _response(
    request: dict[str, Any], success: bool, body: dict[str, Any] | None = None, message: str = ""
) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "seq": 0, "type": "response", "request_seq": request.get("seq"), "success": success,
        "command": request.get("command"), "body": body if body is not None else {},
    }  # fmt: skip
    if message:
        reply["message"] = message
    return reply
