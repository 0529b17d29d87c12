"""The engine zygote: one process that imports what every engine needs, then forks engines.

An engine started as a fresh Python spends most of its start importing torch, ipyparallel's
engine and nbdist's engine side (~2 s of CPU each on a small machine), and N engines pay it N
times. The zygote pays it once: `Cluster.start` launches it first (its imports overlap the
controller's start-up), and the local launcher (`zygote_launcher`) asks it for each engine.
A forked engine shares the imported modules' memory with the zygote until it writes to it.

Protocol (`nbdist.cluster.launch.zygote.Zygote` is the other side): the zygote listens on a
Unix socket (`argv[1]`, in a directory only its owner can enter) from the moment it starts,
and answers one request per connection: a JSON line `{"args", "env", "cwd", "output"}` (the
command line, the full environment, the working directory and the log file the launcher
would have given a new process) gets `{"pid": P}` once the engine is forked (requests made
while the imports run wait for them), or `{"error": "..."}`. Its stdin is a pipe from the
process that started it: end of file (a stop, or that process died: the OS closes the pipe)
makes the zygote terminate the engines it forked that are still running and exit.

Each forked engine, before it runs ipyparallel's engine with the requested arguments
(`_engine_main.run`): starts a session of its own (as ipyparallel's launcher does), sends its
stdout and stderr to its own log file, takes the requested working directory and environment
(`CUDA_VISIBLE_DEVICES`, `NBDIST_*`, ...), draws fresh seeds for Python's `random`, torch and
numpy (if imported) as a fresh process would, and watches the zygote as its
parent (`parent_watch`: the zygote watches the notebook, so a killed notebook stops both).

Note [No CUDA before fork]: the zygote imports torch but never initialises CUDA (no
`torch.cuda.is_available()`, no device count: those load the driver too). A process that has
initialised CUDA cannot use it in a forked child ("Cannot re-initialize CUDA in forked
subprocess"), and each engine must start CUDA itself, after its `CUDA_VISIBLE_DEVICES` is set,
to see only its GPU. `torch.cuda.is_initialized()` is checked before every fork; a zygote that
finds it True refuses to fork (the launcher then reports the error).

A forked engine keeps the zygote's command line (`ps` shows `..._zygote_main`); its name
(`ps -o comm`, `top`, psutil's `name()`) is `nbdist-engine`, its nanny's `nbdist-nanny`.

Seeds: each engine draws new seeds from the OS for Python's `random`, torch's global
generator (CPU) and numpy's global generator (if imported), as a fresh process does; Python's
hash seed (string hashing) is the zygote's, shared by its engines.

Example (a process of its own; `Zygote.start` runs it)::

    python -m nbdist.cluster.launch._zygote_main /tmp/nbdist-zygote-x/socket --nbdist-parent=42
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any, NoReturn

from nbdist.cluster.launch import handover
from nbdist.cluster.launch.process_name import name_process

_POLL_S = 0.5  # how often the zygote looks at its parent while nothing else happens
_GRACE_S = 3.0  # seconds engines get to exit after SIGTERM when the zygote stops


def main() -> None:
    """Listen, import, then fork engines on request until stdin closes."""
    from nbdist.cluster.launch.parent_watch import _parent_from_argv

    parent = _parent_from_argv() or os.getppid()
    listener = handover.listen(sys.argv[1])
    _import_engine_modules()
    _serve(listener, parent)


def _import_engine_modules() -> None:
    """What `_engine_main` imports, once for every engine (no CUDA: Note [No CUDA before fork])."""
    import torch  # noqa: F401
    from ipyparallel.engine import nanny  # noqa: F401
    from ipyparallel.engine.app import IPEngine  # noqa: F401

    from nbdist.cluster.engine_side import entry_points, guards, joining  # noqa: F401
    from nbdist.cluster.launch import _engine_main  # noqa: F401

    # pydevd (imported by ipykernel.debugger) warns at import that Python's frozen modules may
    # hide breakpoints, in the zygote's log; the engines' own environment is the launcher's
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for module in _IMPORTED_BY_EACH_ENGINE:  # what an engine imports as it starts, once here
        with contextlib.suppress(Exception):  # a missing optional one: the engine skips it too
            __import__(module)


_IMPORTED_BY_EACH_ENGINE = (
    "ipykernel.debugger",  # debugpy and pydevd, ~130 modules (~0.1 s), for the kernel's debugger
    "IPython.core.completerlib",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "sqlite3",
    "tornado.queues",
    "tornado.platform.asyncio",
    "bdb",
    "numpy.random",  # each engine's fresh seed (`_reseed`)
    # what joining the group imports: the strategy, collectives and values (~50 modules)
    "nbdist.strategies.multi_worker",
    "nbdist.strategies.resizable",
    "nbdist.cluster.engine_side.publisher",
    "nbdist.cluster.engine_side.progress",
    "nbdist.cluster.engine_side.stacks",
)
"""Modules each forked engine imported after the fork (its kernel's start), found by comparing
an engine's `sys.modules` with the zygote's; none starts a thread or opens a file."""

def _serve(listener: socket.socket, parent: int) -> None:
    children: set[int] = set()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    signal.signal(signal.SIGTERM, lambda *_: _stop(children, 0))
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([listener, stdin, wake_read], [], [], _POLL_S)
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
        _reap(children)
        if stdin in ready and not os.read(stdin, 512):
            _stop(children, 0)  # the cluster stopped, or the notebook died
        if os.getppid() != parent:
            _stop(children, 75)
        if listener in ready:
            connection, _ = listener.accept()
            with connection:
                _answer(connection, listener, children, (wake_read, wake_write))


def _answer(
    connection: socket.socket,
    listener: socket.socket,
    children: set[int],
    wake: tuple[int, int],
) -> None:
    connection.settimeout(handover.REQUEST_TIMEOUT_S)
    try:
        request = json.loads(connection.makefile("rb").readline())
        pid = _fork(request, [listener.fileno(), connection.fileno(), *wake])
    except Exception as error:
        reply: dict[str, Any] = {"error": f"{type(error).__name__}: {error}"}
    else:
        children.add(pid)
        reply = {"pid": pid}
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(reply).encode() + b"\n")


def _fork(request: dict[str, Any], close: list[int]) -> int:
    import torch

    if torch.cuda.is_initialized():  # Note [No CUDA before fork]
        from nbdist.cluster.errors import ClusterStartError

        raise ClusterStartError("CUDA is initialised in the zygote; its forks could not use it")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, close)
    return pid


def _child(request: dict[str, Any], close: list[int]) -> NoReturn:
    """The forked engine: become what `request` asks for, run the engine, exit."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)  # before its pipe is closed here
        for fd in close:  # (their Python objects stay on this stack, never finalised)
            os.close(fd)
        _become_engine(request)
        from nbdist.cluster.launch._engine_main import run

        run(parent=os.getppid())
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _become_engine(request: dict[str, Any]) -> None:
    """In the forked child: the session, output, directory, environment and seeds of a new
    process started with `request`'s command line."""
    for number in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    os.setsid()  # ipyparallel starts engines in a session of their own (start_new_session)
    from nbdist.cluster.launch.zygote import ENGINE_MODULE

    handover.become(request, ENGINE_MODULE)
    _reseed()
    name_process(b"nbdist-engine")


def _reseed() -> None:
    """Fresh seeds where a new process would have drawn them from the OS (the zygote's state
    would otherwise be every engine's)."""
    import random

    import torch

    random.seed()
    torch.seed()  # a fresh process's torch draws its default seed from the OS as well
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


def _reap(children: set[int]) -> None:
    """Collect every exited child at once (an unreaped one stays a zombie, which the
    launcher waiting for its pid would take for running)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)


def _stop(children: set[int], code: int) -> None:
    """Terminate the engines still running, kill those that do not exit, then exit."""
    for pid in list(children):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.02)
    for pid in list(children):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.02)
    os._exit(code)


if __name__ == "__main__":
    main()
