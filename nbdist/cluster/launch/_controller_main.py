"""Controller process entry point: ipyparallel's controller, locked down and watching its parent.

`nd.Cluster` starts its controller as `python -m nbdist.cluster.launch._controller_main ARGS`
instead
of `python -m ipyparallel.controller ARGS` (same arguments). Before handing over it makes every
file the controller writes readable by its owner only (umask 077: connection files, logs), and
starts `watch_parent`, so the controller and its schedulers stop when the process that started
the cluster dies, however it dies; and it writes its connection files atomically, so an engine
waiting for one never reads it half-written. Once its event loop stops (a stop), it exits at
once (`_exit_at_once`).

A spare controller (`SPARE_FLAG=SOCKET`, started by `controller_spare.ControllerSpare` for a
notebook that keeps a cluster warm) does all of that up to the imports (~0.7 s of CPU), then
waits for the launcher's request on SOCKET (`handover.wait_for_request`) and becomes the
controller that request describes: the next `Cluster.start` does not wait for the imports.
"""

from __future__ import annotations

import contextlib
import os


def main() -> None:
    """Lock down, watch the parent, then run ipyparallel's controller (`sys.argv`); a spare
    waits for its command line first."""
    os.umask(0o077)
    spare = _flag_text(SPARE_FLAG)
    from nbdist.cluster.launch.parent_watch import watch_parent

    watch_parent()
    from ipyparallel.controller.app import IPController
    from ipyparallel.controller.app import main as controller_main

    if spare:
        from nbdist.cluster.launch import handover

        listener = handover.listen(spare)
        handover.become(handover.wait_for_request(listener), CONTROLLER_MODULE)
    IPController.save_connection_dict = _save_connection_dict_atomically
    _beat_fast_until_registered(_flag_value(START_ENGINES_FLAG))
    controller_main()
    _exit_at_once()


CONTROLLER_MODULE = "nbdist.cluster.launch._controller_main"
"""The module the controller runs (`python -m ...`)."""
SPARE_FLAG = "--nbdist-spare="
"""Argument of a spare controller: the Unix socket on which it waits for its command line."""
START_ENGINES_FLAG = "--nbdist-start-engines="
"""Argument naming how many engines the start waits for (`_beat_fast_until_registered`)."""

START_BEAT_MS = 50
"""The heartbeat period while engines register (Note [A fast beat while engines register])."""


def _flag_value(flag: str) -> int:
    """Remove `FLAG=N` from `sys.argv` (ipyparallel would refuse it); N, or 0 without it."""
    with contextlib.suppress(ValueError):
        return int(_flag_text(flag) or 0)
    return 0


def _flag_text(flag: str) -> str:
    """Remove `FLAG=TEXT` from `sys.argv`; TEXT, or "" without it."""
    import sys

    for index, argument in enumerate(sys.argv[1:], start=1):
        if argument.startswith(flag):
            del sys.argv[index]
            return argument[len(flag) :]
    return ""


# Note [A fast beat while engines register]: ipyparallel's controller finishes an engine's
# registration only when the engine's heart answers a heartbeat, so every engine waited up to
# one period (0.5 s by default, and a registration round trip per beat on a busy machine)
# after it asked to register. While fewer hearts beat than engines are starting, the heart
# monitor beats every START_BEAT_MS and counts no missed beats (an engine is not missing
# beats before it registered); once every engine's heart answered (or after the start's
# timeout), it beats at the cluster's period. The monitor runs in a process forked from this
# one, so patching its class here reaches it.
def _beat_fast_until_registered(engines: int) -> None:
    """Make the heart monitor beat every START_BEAT_MS until `engines` hearts answer."""
    if engines <= 0:
        return
    import time

    from ipyparallel.controller.heartmonitor import HeartMonitor

    start, beat = HeartMonitor.start, HeartMonitor.beat

    def start_fast(monitor: HeartMonitor) -> None:
        start(monitor)
        monitor.caller.callback_time = min(START_BEAT_MS, monitor.period)
        monitor.nbdist_fast_until = time.monotonic() + 120.0

    def beat_fast(monitor: HeartMonitor) -> None:
        until = getattr(monitor, "nbdist_fast_until", None)
        if until is None:
            beat(monitor)
            return
        monitor.on_probation = {}  # no misses counted before every engine registered
        beat(monitor)
        if len(monitor.hearts) >= engines or time.monotonic() > until:
            monitor.caller.callback_time = monitor.period
            monitor.nbdist_fast_until = None

    HeartMonitor.start = start_fast
    HeartMonitor.beat = beat_fast


def _exit_at_once() -> None:
    """Exit 0 now that the controller's event loop has stopped (SIGTERM from `Cluster.stop`).

    Its schedulers were already told to stop, and nothing is left to send; Python's shutdown
    (joining the schedulers, closing sockets that still hold messages for an engine that
    exited without unregistering) took 2-4 s more, most of a `%dist stop`.
    """
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream: nothing left to write
            stream.flush()
    os._exit(0)


def _save_connection_dict_atomically(app: object, fname: str, cdict: dict) -> None:
    """ipyparallel's `IPController.save_connection_dict`, written whole or not at all.

    Engines started before the controller poll for its connection file and read it as soon
    as it exists; ipyparallel writes it in place, so on a loaded machine an engine could read
    it half-written and exit (`JSONDecodeError`, the whole start failing). Writing a temporary
    file in the same folder and renaming it (atomic on POSIX) means the file exists only once
    complete. Same content and mode (owner read/write) as ipyparallel's.
    """
    import json
    import tempfile

    folder = app.profile_dir.security_dir  # type: ignore[attr-defined]
    target = os.path.join(folder, fname)
    app.log.info("writing connection info to %s", target)  # type: ignore[attr-defined]
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{fname}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(json.dumps(cdict, indent=2))
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


if __name__ == "__main__":
    main()
