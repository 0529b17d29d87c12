"""Helpers for tests that start real worker processes (gloo ranks, TF_CONFIG workers).

Start ranks with `run_workers`, give them addresses with `free_ports`, `torchrun_env` and
`tf_config_env`, hand results back from a worker with `report`, check with `assert_all_ok`
and `no_leftover_processes`. Importing this starts nothing.

Example:
    >>> from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
    >>> port = free_port()
    >>> results = run_workers(
    ...     "import os; report(os.environ['RANK'])",
    ...     [torchrun_env(rank, 2, port) for rank in range(2)],
    ... )
    >>> assert_all_ok(results)
    >>> [r.result for r in results]
    ['0', '1']
"""

from nbdist.testing.leftovers import assert_processes_gone, no_leftover_processes
from nbdist.testing.ports import (
    LOCALHOST,
    free_port,
    free_ports,
    tf_config_env,
    torchrun_env,
    wait_for_listener,
)
from nbdist.testing.processes import WorkerResult, assert_all_ok, run_workers, worker_env
from nbdist.testing.results import RESULT_ENV, report

__all__ = [
    "LOCALHOST",
    "RESULT_ENV",
    "WorkerResult",
    "assert_all_ok",
    "assert_processes_gone",
    "free_port",
    "free_ports",
    "no_leftover_processes",
    "report",
    "run_workers",
    "tf_config_env",
    "torchrun_env",
    "wait_for_listener",
    "worker_env",
]
