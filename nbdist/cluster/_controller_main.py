"""Controller process entry point: ipyparallel's controller, locked down and watching its parent.

`nd.Cluster` starts its controller as `python -m nbdist.cluster._controller_main ARGS` instead
of `python -m ipyparallel.controller ARGS` (same arguments). Before handing over it makes every
file the controller writes readable by its owner only (umask 077: connection files, logs), and
starts `watch_parent`, so the controller and its schedulers stop when the process that started
the cluster dies, however it dies; and it writes its connection files atomically, so an engine
waiting for one never reads it half-written. Once its event loop stops (a stop), it exits at
once (`_exit_at_once`).
"""

from __future__ import annotations

import contextlib
import os


def main() -> None:
    """Lock down, watch the parent, then run ipyparallel's controller (`sys.argv`)."""
    os.umask(0o077)
    from nbdist.cluster.parent_watch import watch_parent

    watch_parent()
    from ipyparallel.controller.app import IPController
    from ipyparallel.controller.app import main as controller_main

    IPController.save_connection_dict = _save_connection_dict_atomically
    controller_main()
    _exit_at_once()


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
