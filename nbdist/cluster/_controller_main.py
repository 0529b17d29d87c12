"""Controller process entry point: ipyparallel's controller, locked down and watching its parent.

`nd.Cluster` starts its controller as `python -m nbdist.cluster._controller_main ARGS` instead
of `python -m ipyparallel.controller ARGS` (same arguments). Before handing over it makes every
file the controller writes readable by its owner only (umask 077: connection files, logs), and
starts `watch_parent`, so the controller and its schedulers stop when the process that started
the cluster dies, however it dies.
"""

from __future__ import annotations

import os


def main() -> None:
    """Lock down, watch the parent, then run ipyparallel's controller (`sys.argv`)."""
    os.umask(0o077)
    from nbdist.cluster.parent_watch import watch_parent

    watch_parent()
    from ipyparallel.controller.app import main as controller_main

    controller_main()


if __name__ == "__main__":
    main()
