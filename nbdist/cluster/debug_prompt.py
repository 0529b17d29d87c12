"""The notebook's half of the debugger on replicas: the `(Pdb replica N) ` prompt.

Note [A debugger over a socket]: an engine has no terminal, and a request to a busy engine
queues behind the call it runs, so a replica stopped at `breakpoint()` opens a socket of its
own and publishes where it listens (`engine_side.debugger`). While `supervise` waits for a
call, a `DebugConsole` watches the call's requests for such announcements from a thread and
connects at once (so a replica that stops while the user types at another's prompt is
attached too). When a stopped replica asks for a command, the waiting loop hands over to the
prompt: the kernel's own `input()` (ipykernel's stdin channel, so it works in JupyterLab,
Notebook 7, VS Code and a console), whose prompt names the replica, and the replicas stopped
besides it when there are several. Each line goes to that replica's pdb; what pdb prints comes
back and is printed here. Typed at the prompt and answered here:

- `replica N`: go to replica N's prompt (it must be stopped too);
- `%dist status`: the engines' table, with "stopped in the debugger" and "waiting for replica
  N in the debugger" for the replicas of the call.

Once no replica asks (every stopped one was continued), the waiting loop goes on: output,
deadlines (the time at the prompt does not count), Ctrl-C. Ctrl-C at the prompt leaves the
debugger on every replica (their code stops with `BdbQuit`) and interrupts the call as Ctrl-C
does anywhere else. A replica whose engine dies at the prompt is named, and the call's error
says it died.

Example (what `supervise` does)::

    console = DebugConsole(cluster, engines, parts)
    ...                         # (each time the waiting loop looks at the engines)
    spent = console.poll()      # blocks at the prompt while a replica is stopped
    console.close()
"""

from __future__ import annotations

import builtins
import contextlib
import json
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from nbdist.cluster.cell_names import rename_pdb
from nbdist.cluster.engine_side.debugger import DEBUG_KEY
from nbdist.cluster.status import EngineInfo

__all__ = ["DebugConsole", "debug_notes"]

_SWITCH_AFTER_S = 1.0
"""Seconds the prompt waits for the replica that was sent a command to ask again, before it
goes back to the waiting loop (or to another stopped replica's prompt)."""
_WATCH_S = 0.05
_consoles: weakref.WeakValueDictionary[int, DebugConsole] = weakref.WeakValueDictionary()
visual_debugger: list[Callable[[int, socket.socket], None]] = []
"""Where a replica stopped by the visual debugger's breakpoints goes (`engine_side.dap`):
`sink(replica, connection)`, set by the notebook kernel's bridge
(`nbdist.magics._visual_debugger`); without one, such a stop gets the prompt."""


def debug_notes(cluster: Any) -> dict[int, str]:
    """`{replica: note}` for the replicas of the call now waiting at the debugger prompt on
    `cluster` (empty when none): `%dist status` prints them."""
    console = _consoles.get(id(cluster))
    return console.notes() if console is not None else {}


class _Session:
    """One stopped replica's connection."""

    def __init__(self, replica: int, connection: socket.socket, why: str):
        self.replica = replica
        self.connection = connection
        self.why = why
        self.state = "running"  # running | asking | done | gone
        self.kind = "pdb"
        self.where = ""
        self._buffer = b""

    def pump(self, timeout: float, write: Callable[[int, str], None]) -> None:
        """Read what arrived (waiting up to `timeout` for something), acting on each message."""
        if self.state in ("done", "gone"):
            return
        try:
            ready, _, _ = select.select([self.connection], [], [], max(0.0, timeout))
            if not ready:
                return
            chunk = self.connection.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.state = "gone" if self.state != "done" else "done"
            return
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                self._handle(json.loads(line), write)

    def _handle(self, message: dict[str, Any], write: Callable[[int, str], None]) -> None:
        if "out" in message:
            text = rename_pdb(str(message["out"]))
            write(self.replica, text)
            for line in text.splitlines():
                if line.startswith("> "):
                    self.where = line[2:].strip()
        if "ask" in message:
            self.state = "asking"
            self.kind = str(message["ask"])
        if "done" in message:
            self.state = "done"

    def send(self, message: dict[str, Any]) -> bool:
        try:
            self.connection.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            self.state = "gone"
            return False
        if "line" in message:
            self.state = "running"
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.close()


class DebugConsole:
    """Attaches to replicas that stop in a debugger during one call, and runs their prompt.

    Args:
        cluster: The running cluster (named in `%dist status`).
        engines: The call's engines, in replica order.
        parts: Their AsyncResults, in the same order.
        status: Prints `%dist status` (None: the command is not offered).
    """

    def __init__(
        self,
        cluster: Any,
        engines: Sequence[EngineInfo],
        parts: Sequence[Any],
        status: Callable[[], None] | None = None,
    ):
        self.cluster = cluster
        self.engines = list(engines)
        self.parts = list(parts)
        self.status = status or self._status
        self.sessions: dict[int, _Session] = {}
        self.current: int | None = None
        self.no_stdin = False
        self._lock = threading.Lock()
        self._seen: set[tuple[int, int]] = set()
        self._line_start: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # started by the first `poll`
        self._visual: list[socket.socket] = []  # handed to the visual debugger
        _consoles[id(cluster)] = self

    # -- attaching (a thread) ---------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(_WATCH_S):
            for info, part in zip(self.engines, self.parts):
                announced = self._announcement(part)
                if announced is None or (info.id, announced.get("seq")) in self._seen:
                    continue
                self._seen.add((info.id, announced.get("seq")))
                if announced.get("visual") and visual_debugger:
                    connection = self._open(announced)
                    if connection is not None:
                        self._visual.append(connection)
                        visual_debugger[-1](info.rank, connection)
                    continue
                session = self._connect(info, announced)
                if session is not None:
                    with self._lock:
                        old = self.sessions.get(info.rank)
                        if old is not None:
                            old.close()
                        self.sessions[info.rank] = session

    def _announcement(self, part: Any) -> dict[str, Any] | None:
        client = getattr(self.cluster, "connected_client", None) or self.cluster.client
        for msg_id in list(getattr(part, "msg_ids", ())):
            md = client.metadata.get(msg_id)
            found = md.get("data", {}).get(DEBUG_KEY) if md is not None else None
            if found is not None:
                return found
        return None

    def _connect(self, info: EngineInfo, announced: dict[str, Any]) -> _Session | None:
        connection = self._open(announced)
        if connection is None:
            return None
        return _Session(info.rank, connection, str(announced.get("why", "breakpoint()")))

    def _open(self, announced: dict[str, Any]) -> socket.socket | None:
        try:
            connection = socket.create_connection(
                (announced["address"], int(announced["port"])), timeout=5.0
            )
            connection.sendall((str(announced["token"]) + "\n").encode())
            connection.settimeout(None)
        except (OSError, KeyError, ValueError):
            return None
        return connection

    # -- the prompt (the notebook's main thread) ---------------------------------------------
    def poll(self) -> float:
        """Print what stopped replicas sent; while one asks, run the prompt. Returns the
        seconds spent at the prompt (the call's deadline moves by as much).

        The first call starts the thread that attaches to stopped replicas: `supervise` polls
        only once a call has run for a moment, so quick calls never start one."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="nbdist-debug", daemon=True)
            self._thread.start()
        self._pump(0.0)
        if not self._asking():
            return 0.0
        began = time.monotonic()
        self._prompt()
        return time.monotonic() - began

    def notes(self) -> dict[int, str]:
        """`{replica: note}`: stopped replicas, and the call's others waiting for them."""
        with self._lock:
            sessions = {r: s for r, s in self.sessions.items() if s.state in ("asking", "running")}
        if not sessions:
            return {}
        stopped = sorted(sessions)
        named = ", ".join(str(r) for r in stopped)
        notes = {}
        for info, part in zip(self.engines, self.parts):
            if info.rank in sessions:
                where = sessions[info.rank].where
                notes[info.rank] = "is stopped in the debugger" + (f" at {where}" if where else "")
            elif not part.ready():
                notes[info.rank] = f"is waiting for replica {named} in the debugger"
        return notes

    def _status(self) -> None:
        """`%dist status` at the prompt: the engines' table and what the call's replicas do."""
        print(self.cluster.status())
        for rank, note in sorted(self.notes().items()):
            print(f"Replica {rank} {note}.")

    def close(self) -> None:
        """Stop watching; close every connection (the engines end their sessions with the
        call)."""
        self._stop.set()
        # a Ctrl-C inside `Thread.start` (it waits for the thread to begin) can leave a thread
        # that never began, or began unrecorded: it sees `_stop` and ends by itself
        if self._thread is not None and self._thread.ident is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            session.close()
        for connection in self._visual:  # (Ctrl-C) a replica still stopped leaves pdb
            with contextlib.suppress(OSError):
                connection.sendall(b'{"leave": true}\n')
        if _consoles.get(id(self.cluster)) is self:
            del _consoles[id(self.cluster)]

    def leave(self) -> None:
        """Ctrl-C at the prompt: leave the debugger on every replica (their code stops)."""
        with self._lock:
            sessions = list(self.sessions.values())
        for session in sessions:
            if session.state in ("asking", "running"):
                session.send({"leave": True})
            session.close()

    def _show(self, replica: int, text: str) -> None:
        """Print what replica `replica`'s pdb printed; each line named `[replica N]` when it
        is not the replica at the prompt and others are stopped too."""
        if replica != self.current and len(self.sessions) > 1:
            out = []
            for line in text.splitlines(keepends=True):
                out.append(
                    f"[replica {replica}] {line}" if self._line_start.get(replica, True) else line
                )
                self._line_start[replica] = line.endswith("\n")
            text = "".join(out)
        elif text:
            self._line_start[replica] = text.endswith("\n")
        print(text, end="", flush=True)

    def _asking(self) -> list[int]:
        with self._lock:
            return sorted(r for r, s in self.sessions.items() if s.state == "asking")

    def _pump(self, timeout: float) -> None:
        with self._lock:
            sessions = list(self.sessions.values())
        began = time.monotonic()
        for session in sessions:
            left = timeout - (time.monotonic() - began)
            session.pump(left if session.replica == self.current else 0.0, self._show)
            if session.state == "gone":
                self._gone(session)

    def _gone(self, session: _Session) -> None:
        with self._lock:
            if self.sessions.get(session.replica) is not session:
                return
            del self.sessions[session.replica]
        session.close()
        part = dict(zip((i.rank for i in self.engines), self.parts)).get(session.replica)
        dead = part is not None and part.ready() and not _succeeded(part)
        print(
            f"[nbdist] Replica {session.replica} left the debugger: "
            + ("its engine died or its call failed." if dead else "its connection closed.")
        )

    def _prompt(self) -> None:
        while True:
            asking = self._asking()
            if not asking:
                return
            if self.current not in asking:
                if self.current is None and len(asking) > 1:
                    print(f"[nbdist] Replicas {', '.join(map(str, asking))} are stopped; "
                          "`replica N` goes to replica N's prompt.")  # fmt: skip
                if self.current in self.sessions:
                    print(f"[nbdist] Replica {self.current} runs on; replica {asking[0]} stopped.")
                self.current = asking[0]
            session = self.sessions[self.current]
            if self.no_stdin:
                session.send({"line": "c"})
                self._wait_for(session)
                continue
            line = self._read(self._prompt_text(session, asking))
            if line is None:
                continue
            if not session.send({"line": line}):
                self._gone(session)
                continue
            self._wait_for(session)

    def _read(self, prompt: str) -> str | None:
        """One line typed at the prompt; None when it was answered here. Ctrl-C leaves the
        debugger and re-raises."""
        try:
            line = builtins.input(prompt)
        except KeyboardInterrupt:
            self.leave()
            raise
        except Exception as error:  # a front end without stdin (StdinNotImplementedError)
            self.no_stdin = True
            print(
                f"[nbdist] The debugger prompt needs input from the front end, which it "
                f"refused ({type(error).__name__}: {error}); the stopped replicas go on. "
                "Run the cell from a front end that allows input (JupyterLab, Notebook 7, VS "
                "Code, jupyter console)."
            )
            return None
        words = line.split()
        if len(words) == 2 and words[0] == "replica":
            self._switch(words[1])
            return None
        if line.strip() == "%dist status" and self.status is not None:
            self.status()
            return None
        return line

    def _switch(self, word: str) -> None:
        asking = self._asking()
        if word.isdigit() and int(word) in asking:
            self.current = int(word)
            where = self.sessions[self.current].where
            if where:
                print(f"> {where}")
            return
        print(
            f"Replica {word} is not stopped in the debugger; stopped: "
            f"{', '.join(str(r) for r in asking)}. Use `replica N` with one of them."
        )

    def _wait_for(self, session: _Session) -> None:
        """After a command: wait (up to `_SWITCH_AFTER_S`) for `session` to ask again, printing
        what it sends; then back to the prompt loop, which goes on with whoever asks."""
        deadline = time.monotonic() + _SWITCH_AFTER_S
        while session.state == "running" and time.monotonic() < deadline:
            session.pump(min(0.1, deadline - time.monotonic()), self._show)
            if session.state == "running" and session.replica in self._finished():
                session.state = "gone"
        if session.state == "gone":
            self._gone(session)
        elif session.state == "done":
            with self._lock:
                if self.sessions.get(session.replica) is session:
                    del self.sessions[session.replica]
            session.close()
        self._pump(0.0)

    def _finished(self) -> list[int]:
        return [info.rank for info, part in zip(self.engines, self.parts) if part.ready()]

    def _prompt_text(self, session: _Session, asking: list[int]) -> str:
        others = f"; stopped: {', '.join(str(r) for r in asking)}" if len(asking) > 1 else ""
        if session.kind == "python":
            return f"(replica {session.replica}{others}) >>> "
        if session.kind == "python-more":
            return f"(replica {session.replica}{others}) ... "
        return f"(Pdb replica {session.replica}{others}) "


def _succeeded(part: Any) -> bool:
    try:
        reply = part.get(timeout=0)
    except Exception:
        return False
    reply = reply[0] if isinstance(reply, list) and reply else reply
    return isinstance(reply, dict) and bool(reply.get("ok"))
