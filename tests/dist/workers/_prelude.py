"""The start every worker script of tests/dist shares, so that a script holds only its own case.

A worker script's body (run by `nbdist.testing.run_workers` as `__main__`, in one fresh Python per
worker, with the launch's torchrun variables or TF_CONFIG in its environment) begins with
`start`, which keeps torch to one thread (the workers of a test share a few CPU cores) and joins
the workers in a `MultiWorkerMirroredStrategy` over gloo. The scripts import this module as
`tests.dist.workers._prelude`; the workers find `tests` on their PYTHONPATH, which
tests/dist/conftest.py sets to this checkout. Importing it runs nothing.

Example (the top of a worker script)::

    from tests.dist.workers._prelude import start

    if "report" not in globals():  # run_workers predefines it (a test may pass its own)
        from nbdist.testing import report

    if __name__ == "__main__":
        strategy, rank = start(timeout_seconds=20)  # rank: this worker's task_id
        report({"rank": rank, "replicas": strategy.num_replicas_in_sync})
"""

from __future__ import annotations

import torch

import nbdist as nd

__all__ = ["one_thread", "start"]


def one_thread() -> None:
    """Keep torch to one intra-op thread in this worker: the workers of a test share few cores.

    For a script that makes its strategy itself (after reading its environment, or in code a
    test appends); `start` calls it first.
    """
    torch.set_num_threads(1)


def start(timeout_seconds: float | None = None) -> tuple[nd.MultiWorkerMirroredStrategy, int]:
    """Join this worker to the others: one torch thread, then a MultiWorkerMirroredStrategy.

    Args:
        timeout_seconds: The strategy's collective timeout
            (`CommunicationOptions(timeout_seconds=...)`); None keeps the default options.

    Returns:
        The strategy, and this worker's rank (`strategy.cluster_resolver.task_id`).
    """
    one_thread()
    options = None
    if timeout_seconds is not None:
        options = nd.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
    return strategy, strategy.cluster_resolver.task_id
