"""The engine's half of the debugger on replicas: `breakpoint()` in a call from the notebook,
`nd.breakpoint(replica=...)`, and the post-mortem of the engine's last failure.

Runs on the engine. An engine has no terminal, so pdb talks to the notebook instead
(Note [A debugger over a socket]): while a call from the notebook runs (`guards.watched_call`:
a `%%distribute` cell, `strategy.run`, `run_steps`), `sys.breakpointhook` is `hook`, and a
replica that reaches `breakpoint()`:

1. opens a listening socket on its own address (the stack server's, 127.0.0.1 for local
   engines) and publishes `{"nbdist_debug": {address, port, token, replica, seq}}` with
   ipyparallel's data publication, attached to the request it runs;
2. waits (up to `ACCEPT_S`) for the notebook (`nbdist.cluster.debug_prompt`) to connect and
   present the token; without a notebook (the request did not come through `supervise`), it
   says so on stderr and goes on, as if the breakpoint were not there;
3. runs `NotebookPdb`, whose stdin and stdout are that connection: one JSON line per message,
   `{"out": text}` and `{"ask": "pdb"|"python"}` from the engine, `{"line": text}` or
   `{"leave": true}` from the notebook.

While it waits for the notebook or for a command, the replica is held (`held.held()`), so its
peers' collective timeouts pause (Note [Held replicas] in `nbdist.collectives.held`). `c`
with no breakpoints set ends the session and the replica runs on untraced; the end of the call
ends any session left. The notebook leaving (Ctrl-C at the prompt, a closed connection) is `q`:
the replica's code stops with `BdbQuit`, and the notebook interrupts the call as Ctrl-C does.

Every failure reply (`failures.failure_reply`) keeps the error (`remember_failure`), so
`%dist debug` can run `post_mortem` later: the same prompt, in the failing frames.

Example (on an engine, inside a cell)::

    x = 3
    breakpoint()        # the notebook shows `(Pdb replica 1) `
"""

from __future__ import annotations

import code
import contextlib
import hmac
import inspect
import io
import itertools
import json
import os
import pdb
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from nbdist.cluster.engine_side import state

__all__ = [
    "ACCEPT_S",
    "DEBUG_KEY",
    "NotebookPdb",
    "breakpoints",
    "end_session",
    "hook",
    "post_mortem",
    "remember_failure",
    "stop_here",
    "visual_session",
]

DEBUG_KEY = "nbdist_debug"
"""The key of a debugger's announcement in the data an engine publishes for its request."""
ACCEPT_S = 30.0
"""Seconds a stopped replica waits for the notebook to attach before it goes on."""
_SKIP = ["nbdist.*", "ipyparallel.*", "IPython.*", "ipykernel.*", "zmq.*", "tornado.*", "asyncio.*"]
_seq = itertools.count(1)
_last: dict[str, Any] = {"error": None, "session": None}


def remember_failure(error: BaseException) -> None:
    """Keep `error` (and so its traceback's frames) as this engine's last failure, for
    `%dist debug` (called by `failures.failure_reply`)."""
    _last["error"] = error


@contextlib.contextmanager
def breakpoints() -> Iterator[None]:
    """Make `breakpoint()` open the notebook's prompt while the block (a call from the
    notebook) runs; any session left open ends with it."""
    previous = sys.breakpointhook
    sys.breakpointhook = hook
    try:
        yield
    finally:
        sys.breakpointhook = previous
        _end_session("the call ended")


def hook(*args: Any, **kwargs: Any) -> None:
    """`sys.breakpointhook` on an engine during a call: stop in the caller's frame, with the
    prompt in the notebook. `PYTHONBREAKPOINT=0` turns it off, as for Python's own hook."""
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return
    caller = inspect.currentframe()
    stop_here(caller.f_back if caller is not None else None, "breakpoint()")


def stop_here(frame: FrameType | None, why: str) -> None:  # also `hook.stop_here`
    """Stop this replica in `frame` with the notebook's debugger prompt (a no-op, said on
    stderr, when no notebook attaches within `ACCEPT_S`)."""
    session = _last["session"]
    if session is None or session.closed:
        channel = _attach(why)
        if channel is None:
            return
        session = _last["session"] = NotebookPdb(channel)
    session.set_trace(frame)


hook.stop_here = stop_here  # type: ignore[attr-defined]  # nd.breakpoint() finds it here


def visual_session() -> NotebookPdb:
    """A session for the visual debugger's line breakpoints (`engine_side.dap`), made this
    engine's session (so `breakpoint()` stops in it too); it attaches when a replica stops."""
    session = NotebookPdb(_LazyChannel("breakpoint", visual=True))
    _last["session"] = session
    return session


def end_session(session: NotebookPdb) -> None:
    """End `session` (with its breakpoints) if it is still this engine's session."""
    if _last["session"] is session:
        _end_session("the call ended")
    else:
        session.clear_all_breaks()


def post_mortem(_request: Any = None) -> dict[str, Any]:
    """Open the notebook's prompt in the frames of this engine's last failure (`%dist debug`
    sends this by reference through `supervise`); a reply dict, as the other entry points."""
    from nbdist.cluster import _wire
    from nbdist.errors import ContextError

    error = _last["error"]
    try:
        if error is None or error.__traceback__ is None:
            rank = state.rank()
            raise ContextError(
                f"Replica {rank} has no failure to debug: its engine keeps the traceback of "
                "its last failed cell or strategy.run, and none failed since it started. Run "
                "the failing cell again, then `%dist debug`."
            )
        tb = _user_traceback(error.__traceback__)
        channel = _attach(f"post-mortem of {type(error).__name__}")
        if channel is None:
            raise ContextError(
                "No notebook attached to the post-mortem debugger; run `%dist debug` in the "
                "notebook (not through ipyparallel directly)."
            )
        debugger = NotebookPdb(channel)
        try:
            channel.write(f"{type(error).__name__}: {error}\n")
            debugger.reset()
            debugger.interaction(None, tb)
        finally:
            channel.close("post-mortem ended")
    except BaseException as failure:
        return _wire.failure(failure, "post-mortem")
    return {"ok": True, "value": _wire.dumps(None), "elapsed": 0.0}


class _Channel:
    """One debugger session's connection to the notebook (Note [A debugger over a socket])."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.reader = connection.makefile("r", encoding="utf-8", newline="\n")
        self.closed = False
        self.failed = False  # no notebook attached (`_LazyChannel`): the code goes on
        self.inspector: Any = None  # answers the visual debugger's queries (`engine_side.dap`)

    def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.connection.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            self.closed = True

    def write(self, text: str) -> None:
        if text:
            self.send({"out": text})

    def ask(self, kind: str) -> str:
        """The next line the user typed at the notebook's prompt ("" once the notebook left)."""
        from nbdist.collectives.held import held

        if self.closed:
            return ""
        if self.inspector is not None:
            self.inspector.reset()  # a new stop: the refs of the last one are stale
        with held():  # Note [Held replicas]: the peers' collective timeouts pause
            self.send({"ask": kind})
            while True:
                try:
                    line = self.reader.readline()
                except OSError:
                    line = ""
                if not line:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    return ""
                if "query" not in message or self.inspector is None:
                    break
                # the visual debugger asks about frames and variables while pdb waits
                self.send({"answer": self.inspector.answer(message["query"]),
                           "id": message.get("id")})  # fmt: skip
        if not line:
            self.closed = True
            return ""
        if message.get("leave"):
            self.closed = True
            return ""
        return str(message.get("line", ""))

    def close(self, why: str) -> None:
        if not self.closed:
            self.send({"done": why})
        self.closed = True
        with contextlib.suppress(OSError):
            self.reader.close()
            self.connection.close()


class _LazyChannel(_Channel):
    """A channel that attaches to the notebook on its first use: the session of the visual
    debugger's line breakpoints (`engine_side.dap`) exists before any replica stops, and most
    calls never stop. Without a notebook it is `failed`, and pdb continues (see `_In`)."""

    def __init__(self, why: str, visual: bool = False):  # no super(): no socket yet
        self.connection = None  # type: ignore[assignment]
        self.reader = None  # type: ignore[assignment]
        self.closed = False
        self.failed = False
        self.inspector = None
        self._why = why
        self._visual = visual

    def _attached(self) -> bool:
        if self.connection is None and not self.closed:
            channel = _attach(self._why, visual=self._visual)
            if channel is None:
                self.closed = self.failed = True
                return False
            self.connection, self.reader = channel.connection, channel.reader
        return not self.closed

    def send(self, message: dict[str, Any]) -> None:
        if self._attached():
            super().send(message)

    def ask(self, kind: str) -> str:
        return super().ask(kind) if self._attached() else ""

    def close(self, why: str) -> None:
        if self.connection is None:
            self.closed = True
            return
        super().close(why)


class _Out(io.TextIOBase):
    """pdb's stdout: what it writes goes to the notebook."""

    def __init__(self, channel: _Channel):
        self._channel = channel

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._channel.write(text)
        return len(text)


class _In(io.TextIOBase):
    """pdb's stdin: each line is one command typed at the notebook's prompt; "q" once the
    notebook has left (Ctrl-C at the prompt, or the connection closed)."""

    def __init__(self, channel: _Channel):
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:
        line = "" if self._channel.closed else self._channel.ask("pdb")
        if not self._channel.closed:
            return line + "\n"
        return "c\n" if self._channel.failed else "q\n"  # no notebook came: go on


class NotebookPdb(pdb.Pdb):
    """pdb whose prompt is in the notebook (see the module docstring); skips the frames of
    nbdist, ipyparallel and IPython when stepping."""

    def __init__(self, channel: _Channel):
        super().__init__(stdin=_In(channel), stdout=_Out(channel), skip=_SKIP, nosigint=True)
        self.channel = channel
        self.prompt = ""  # the notebook shows its own, naming the replica

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def set_continue(self) -> None:
        if self.channel.failed:  # no notebook attached: nothing may stop here again
            self.clear_all_breaks()
        super().set_continue()
        if not self.breaks:  # nothing else can stop here: the session is over
            self.channel.close("continued")

    def set_quit(self) -> None:
        super().set_quit()
        self.channel.close("quit")

    def setup(self, f: FrameType | None, tb: TracebackType | None) -> Any:
        """As pdb's, then (post-mortem) start in the innermost frame of the user's code."""
        result = super().setup(f, tb)
        if tb is not None:
            index = self.curindex
            while index > 0 and not _user_frame(self.stack[index][0]):
                index -= 1
            if _user_frame(self.stack[index][0]):
                self.curindex = index
                self.curframe = self.stack[index][0]
                self.curframe_locals = self.curframe.f_locals
        return result

    def do_interact(self, arg: str) -> None:
        """interact
        Start an interactive interpreter in the current frame's namespace; `exit()` (or
        `quit()`) returns to the debugger."""
        namespace = {**self.curframe.f_globals, **self.curframe_locals}
        out = _Out(self.channel)
        console = _Console(namespace, out)
        self.message("*interactive* (exit() returns to the debugger)")
        more = False
        while not self.channel.closed:
            line = self.channel.ask("python-more" if more else "python")
            if self.channel.closed or line.strip() in ("exit()", "quit()"):
                break
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                more = console.push(line)

    complete_interact = pdb.Pdb.completenames


class _Console(code.InteractiveConsole):
    """`interact`'s interpreter: errors are printed to the notebook as plain tracebacks (not
    through the engine's `sys.excepthook`)."""

    def __init__(self, namespace: dict[str, Any], out: _Out):
        super().__init__(namespace)
        self._out = out

    def write(self, data: str) -> None:
        self._out.write(data)

    def showtraceback(self) -> None:
        import traceback

        kind, value, tb = sys.exc_info()
        frames = traceback.extract_tb(tb)[1:]  # without code.py's own frame
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
        lines += traceback.format_exception_only(kind, value)
        self.write("".join(lines))

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        import traceback

        kind, value, _ = sys.exc_info()
        self.write("".join(traceback.format_exception_only(kind, value)))


def _attach(why: str, visual: bool = False) -> _Channel | None:
    """Announce this stop to the notebook and wait for it to connect (held meanwhile);
    `visual`: the stop is JupyterLab's visual debugger's (`engine_side.dap`), not a prompt's."""
    from nbdist.collectives.held import held

    rank = state.rank()
    bind = _bind_address()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((bind, 0))
        listener.listen(1)
        token = secrets.token_hex(16)
        try:
            from ipyparallel.datapub import publish_data

            publish_data({DEBUG_KEY: {
                "seq": next(_seq), "replica": rank, "address": bind,
                "port": listener.getsockname()[1], "token": token, "why": why,
                "pid": os.getpid(), "time": time.time(), "visual": visual,
            }})  # fmt: skip
        except Exception:
            return _no_notebook(rank, why)
        with held():
            deadline = time.monotonic() + ACCEPT_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _no_notebook(rank, why)
                listener.settimeout(left)
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    return _no_notebook(rank, why)
                connection.settimeout(10.0)
                try:
                    given = connection.makefile("r").readline().strip()
                except OSError:
                    given = ""
                if hmac.compare_digest(given.encode(), token.encode()):
                    connection.settimeout(None)
                    return _Channel(connection)
                connection.close()  # not the notebook: keep waiting for it
    finally:
        listener.close()


def _no_notebook(rank: int | None, why: str) -> None:
    print(
        f"[nbdist] {why} on replica {rank}: no notebook debugger attached within "
        f"{ACCEPT_S:g} s (the prompt opens for %%distribute cells and strategy.run called from "
        "the notebook); the code goes on.",
        file=sys.stderr,
        flush=True,
    )
    return None


def _end_session(why: str) -> None:
    session = _last["session"]
    _last["session"] = None
    if session is not None:
        sys.settrace(None)
        session.clear_all_breaks()  # pdb's breakpoints are global (bdb.Breakpoint.bplist)
        session.channel.close(why)


def _bind_address() -> str:
    from nbdist.cluster.engine_side.stacks import _server

    address = _server.get("address")
    return address[0] if address else "127.0.0.1"


def _user_frame(frame: FrameType) -> bool:
    from nbdist.cluster.engine_side.user_code import is_user_file

    return is_user_file(frame.f_code.co_filename)


def _user_traceback(tb: TracebackType) -> TracebackType:
    """`tb` from the first frame of the user's code (nbdist's calling frames left out)."""
    first = tb
    while first is not None and not _user_frame(first.tb_frame):
        first = first.tb_next
    return first or tb
