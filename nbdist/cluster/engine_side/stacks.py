"""The engine's stack server: a thread that answers "where are you?" while a cell runs.

A request to an ipyparallel engine queues behind the cell it is running, so `%dist stack`
cannot ask through ipyparallel. `joining.bootstrap` starts this server instead: one daemon
thread listening on a TCP port of the engine's own address (127.0.0.1 for local engines),
answering a request that carries the engine's token (random, 128 bits, handed to the
notebook by `bootstrap`) with JSON: every thread's Python stack (`sys._current_frames()`),
and the collective the process is in or last finished (`nbdist.collectives.recorder`), or
the recorder's entries. It reads and changes nothing else: the cell goes on.

It answers while the engine's main thread is blocked in C (a gloo or NCCL wait, `recv`,
`time.sleep`, a data loader's queue): those calls release the GIL. A main thread that holds
the GIL in C for longer than the notebook's timeout leaves the request unanswered; the
notebook names the engine as not answering.

Example (on an engine; the notebook's half is `nbdist.cluster.stacks`)::

    address, port, token = start_stack_server("127.0.0.1")
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import threading
import time
import traceback
from typing import Any

from nbdist._private_api import thread_frames
from nbdist.cluster.engine_side import state

__all__ = ["current_stacks", "recorder_entries", "start_stack_server"]

_server: dict[str, Any] = {"address": None}
_REQUEST_BYTES = 64 * 1024  # a completion request carries the token


def current_stacks() -> dict[str, Any]:
    """This process's threads, each as a list of `(filename, lineno, function, line)`
    frames, outermost first, and the collective it is in or last finished."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    threads: dict[str, list[tuple]] = {}
    main = threading.main_thread().ident
    for ident, frame in thread_frames().items():
        if ident == me:
            continue
        name = names.get(ident, f"thread {ident:#x}")
        frames = [(f.filename, f.lineno, f.name, f.line or "")
                  for f in traceback.extract_stack(frame)]  # fmt: skip
        threads["MainThread" if ident == main else name] = frames
    group = state.group()
    collective = group.recorder.current() if group is not None else None
    return {
        "rank": state.rank(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "threads": threads,
        "collective": collective,
        "time": time.time(),
    }


def recorder_entries() -> dict[str, Any]:
    """The collective recorder's entries of this process (oldest first)."""
    group = state.group()
    recorder = group.recorder if group is not None else None
    return {
        "rank": state.rank(),
        "generation": recorder.generation if recorder is not None else "",
        "entries": recorder.entries() if recorder is not None else [],
        "previous": recorder.previous if recorder is not None else None,
    }


def start_stack_server(bind: str) -> tuple[str, int, str]:
    """Start this engine's stack server (once) on `bind`; returns `(address, port, token)`."""
    if _server["address"] is not None:
        return _server["address"]
    token = secrets.token_hex(16)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((bind, 0))
    listener.listen(16)
    address = (bind, listener.getsockname()[1], token)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed at exit
                return
            with connection:
                try:
                    _answer(connection, token)
                except Exception:  # a client that went away: keep serving the others
                    continue

    thread = threading.Thread(target=serve, name="nbdist-stacks", daemon=True)
    thread.start()
    _server["address"] = address
    return address


def _answer(connection: socket.socket, token: str) -> None:
    connection.settimeout(2.0)
    request = b""
    while not request.endswith(b"\n") and len(request) < _REQUEST_BYTES:
        chunk = connection.recv(_REQUEST_BYTES)
        if not chunk:
            return
        request += chunk
    given, _, what = request.decode(errors="replace").strip().partition(" ")
    if not hmac.compare_digest(given.encode(), token.encode()):
        return  # not ours: say nothing
    if what == "collectives":
        reply = recorder_entries()
    elif what.startswith(("complete ", "inspect ")):  # Tab and Shift+Tab (`completion`)
        from nbdist.cluster.engine_side import completion

        kind, _, request = what.partition(" ")
        answer = completion.complete if kind == "complete" else completion.inspect_name
        reply = answer(json.loads(request))
    elif what == "collective":  # the watch under a running cell: one small answer a second
        group = state.group()
        current = group.recorder.current() if group is not None else None
        reply = {"rank": state.rank(), "collective": current, "time": time.time()}
    else:
        reply = current_stacks()
    connection.sendall(json.dumps(reply, default=str).encode())
