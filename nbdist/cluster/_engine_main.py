"""Engine process entry point: import torch and nbdist first, then run ipyparallel's engine.

`nd.Cluster` starts its engines as `python -m nbdist.cluster._engine_main ARGS` instead of
`python -m ipyparallel.engine ARGS` (same arguments). Importing torch is most of an engine's
start-up cost; done here, it overlaps with the controller starting (local engines are launched
before the controller and wait for its connection file) instead of following registration. It
also fails early, with ipyparallel's output showing why, where nbdist is not installed for the
engine's Python (a remote host's `remote_python`).

It also starts `watch_parent` first, so the engine stops when the process that started it
dies. (The engine writes none of the cluster's files, so the user's umask stays: files a cell
writes get the usual modes.)
"""

from __future__ import annotations


def main() -> None:
    """Import what every engine needs, then hand over to ipyparallel's engine (`sys.argv`)."""
    from nbdist.cluster.parent_watch import watch_parent

    watch_parent()
    import torch  # noqa: F401  (the expensive import, done before registering)
    from ipyparallel.engine.app import main as engine_main

    import nbdist.cluster._engine_side  # noqa: F401

    engine_main()


if __name__ == "__main__":
    main()
