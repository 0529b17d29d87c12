"""Engine process entry point: import torch and nbdist first, then run ipyparallel's engine.

`nd.Cluster` starts its engines as `python -m nbdist.cluster.launch._engine_main ARGS` instead of
`python -m ipyparallel.engine ARGS` (same arguments). Importing torch is most of an engine's
start-up cost; done here, it overlaps with the controller starting (local engines are launched
before the controller and wait for its connection file) instead of following registration. It
also fails early, with ipyparallel's output showing why, where nbdist is not installed for the
engine's Python (a remote host's `remote_python`).

A normal stop (SIGTERM from `Cluster.stop`) exits with status 0: ipyparallel's engine stops its
event loop from the signal handler, which makes tornado's `run_sync` raise "Event loop stopped
before Future completed" (exit status 1, and a traceback in the engine's log that `%dist stop`
would show). Any other way out keeps its status. A stop that arrives while a request runs
(a cell that caught a KeyboardInterrupt and runs on) exits at once from the signal handler:
the event loop it would stop is not running.

It also starts `watch_parent` first, so the engine stops when the process that started it
dies; an engine started over ssh, which has no such parent, stops once its controller is gone
(`controller_watch`, Note [Engines without a parent]). (The engine writes none of the
cluster's files, so the user's umask stays: files a cell writes get the usual modes.)
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    """Import what every engine needs, then hand over to ipyparallel's engine (`sys.argv`)."""
    run()


def run(parent: int | None = None) -> None:
    """Run ipyparallel's engine with `sys.argv`, stopping when process `parent` dies (default:
    the one `--nbdist-parent=PID` names). An engine forked from the zygote (`parent` is the
    zygote) also forks its nanny instead of starting a new Python for it (`_fork_nanny`).
    An engine started over ssh (no parent to watch) stops once its controller is gone."""
    from nbdist.cluster.launch.parent_watch import NO_PARENT_FLAG, watch_parent

    forked = parent is not None
    watched = forked or NO_PARENT_FLAG not in sys.argv
    if forked:
        _fork_nanny()  # before any thread or zmq context exists in this process
    watch_parent(parent=parent)
    import torch  # noqa: F401  (the expensive import, done before registering)
    from ipyparallel.engine.app import IPEngine

    from nbdist._private_api import stop_noting_engine
    from nbdist.cluster.engine_side import entry_points as calls  # noqa: F401
    from nbdist.cluster.engine_side import guards, joining  # noqa: F401

    Engine = stop_noting_engine(IPEngine, busy=guards.running, exit_now=_exit_at_once)
    if not watched:  # started over ssh: stop once the controller is gone instead
        from nbdist.cluster.launch.controller_watch import watch_controller

        watch_controller(lambda: _registration_url(Engine))
    try:
        Engine.launch_instance()
    except RuntimeError:
        if not Engine.stopping:
            raise
    if Engine.stopping:
        _exit_at_once()


class _Nanny:
    """What the engine keeps of its forked nanny (ipyparallel keeps the nanny's `Popen`): the
    read end of the nanny's pipe, open while the engine lives; the nanny exits when it closes."""

    def __init__(self, pid: int, pipe: Any):
        self.pid = pid
        self.stdout = pipe


def _fork_nanny() -> None:
    """Fork the engine's nanny now, to be given its settings when the engine asks for it.

    ipyparallel's engine starts its nanny (the process that relays signals to it, e.g. an
    interrupt) as `python -m ipyparallel.engine.nanny`, a new Python that imports zmq, tornado
    and ipyparallel again (~0.4 s of CPU) while the engine waits for it to register. This
    forks a copy of the engine instead, before the engine has threads or zmq sockets, which
    waits for the settings that `start_nanny` would have written to the new process's stdin
    (the same pickled arguments) and then runs ipyparallel's `KernelNanny.main` with them. An
    engine that never asks (it crashed first) closes the pipe: the waiting copy exits.
    """
    import os
    import pickle
    import signal

    from ipyparallel.engine import app, nanny

    from nbdist._private_api import replace_nanny_starter

    settings_read, settings_write = os.pipe()
    url_read, url_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the nanny
        code = 0
        try:
            os.close(settings_write)
            os.close(url_read)
            os.setsid()  # as ipyparallel starts it: signals to the engine's group skip it
            from nbdist.cluster.launch.process_name import name_process

            name_process(b"nbdist-nanny")
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            with os.fdopen(settings_read, "rb") as source:
                data = source.read()
            if data:
                kwargs = pickle.loads(data)
                kwargs["pipe"] = os.fdopen(url_write, "w", buffering=1)
                nanny.KernelNanny.main(**kwargs)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(settings_read)
    os.close(url_write)

    def start_nanny(**kwargs: Any) -> tuple[str, _Nanny]:
        kwargs["pid"] = os.getpid()
        with os.fdopen(settings_write, "wb") as sink:
            sink.write(pickle.dumps(kwargs))
        reader = os.fdopen(url_read, "rb")
        url = reader.readline().decode("utf8").strip()
        if not url:
            from nbdist.cluster.errors import ClusterStartError

            raise ClusterStartError(
                f"The engine's nanny (pid {pid}) exited before it started (its error is above "
                "in this engine's output). Set NBDIST_ZYGOTE=0 in the notebook's environment "
                "to start engines and nannies as processes of their own."
            )
        return url, _Nanny(pid, reader)

    replace_nanny_starter(app, start_nanny)


def _registration_url(engine_class: type) -> str | None:
    """The controller's registration URL once ipyparallel's engine has read it, else None."""
    if not engine_class.initialized():  # type: ignore[attr-defined]
        return None
    return engine_class.instance().registration_url or None  # type: ignore[attr-defined]


def _exit_at_once() -> None:
    """Exit 0 now, without Python's shutdown: a stop the user asked for.

    At interpreter shutdown torch destroys the engine's gloo process group, and that waits
    for the peers, which are being stopped one after another: each engine took ~5 s to exit
    (ipyparallel then killed it), or aborted ("terminate called without an active
    exception"). Nothing else is left to do at this point: output is flushed first.
    """
    import contextlib
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream: nothing left to write
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
