"""The receiving half of a hand-over: a process that imported ahead becomes a cluster process.

Two kinds of process start before anyone knows their command line, import what they will
need, then wait: the engine zygote (`_zygote_main`), which forks an engine per request, and a
spare controller (`_controller_main` with `SPARE_FLAG`), which becomes the next cluster's
controller. A launcher (`zygote_launcher`, `controller_launcher`) sends either one a request,
a JSON line `{"args", "env", "cwd", "output"}`: the command line, the full environment, the
working directory and the log file it would have given a new process. `become` makes the
current process look as if it had been started that way; `wait_for_request` is the spare
controller's wait for its one request. Imports neither torch nor ipyparallel.

Example (in the waiting process; replaces its output, directory and environment)::

    request = wait_for_request(listener)      # the launcher's request; it got our pid
    become(request, CONTROLLER_MODULE)
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
from typing import Any

__all__ = ["become", "listen", "wait_for_request"]

REQUEST_TIMEOUT_S = 10.0
"""How long a connected launcher may take to send its request line."""


def listen(path: str) -> socket.socket:
    """A Unix socket listening on `path` (in a directory only its owner can enter)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    return listener


def wait_for_request(listener: socket.socket) -> dict[str, Any]:
    """Wait for one launcher's request on `listener` and answer it with this process's pid.

    Exits the process (status 0) when stdin, a pipe from the process that started it, reaches
    end of file first: that process gave up the spare or died.
    """
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([listener, stdin], [], [])
        if stdin in ready and not os.read(stdin, 512):
            os._exit(0)
        if listener not in ready:
            continue
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(REQUEST_TIMEOUT_S)
            try:
                request = json.loads(connection.makefile("rb").readline())
            except (OSError, ValueError):
                continue  # a launcher that died mid-request: wait for the next one
            connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        listener.close()
        return dict(request)


def become(request: dict[str, Any], module: str) -> None:
    """Take `request`'s output file (stdout and stderr; stdin from /dev/null), working
    directory, environment (all of it) and command line (`sys.argv` as `python -m module`
    would have it, without the parent flag that `parent_watch` has read already)."""
    from nbdist.cluster.launch.parent_watch import PARENT_FLAG

    output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(devnull, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = list(request["args"])
    rest = args[args.index(module) + 1 :] if module in args else args[1:]
    sys.argv = [args[0], *(a for a in rest if not a.startswith(PARENT_FLAG))]
