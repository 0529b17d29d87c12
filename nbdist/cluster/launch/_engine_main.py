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


def main() -> None:
    """Import what every engine needs, then hand over to ipyparallel's engine (`sys.argv`)."""
    from nbdist.cluster.launch.parent_watch import NO_PARENT_FLAG, watch_parent

    watched = NO_PARENT_FLAG not in sys.argv
    watch_parent()
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
