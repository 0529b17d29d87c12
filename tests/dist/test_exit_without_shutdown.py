"""A training script that ends without `strategy.shutdown()` exits with status 0, every time.

Most scripts end that way (TensorFlow has no such call). torch 2.13 often aborts a process whose
gloo process group is left to finalization ("terminate called without an active exception",
SIGABRT, after the script had finished: 16 of 30 launches of a raw torch.distributed script of
2 gloo workers); nbdist destroys the group it created at exit (Note [Process group at exit] in
nbdist/collectives/torch_dist.py). nbdist's own exit path was already much less prone to it
(0 of 30 launches of this script without that hook, but CI saw two such aborts in a few dozen
runs), so this is a guard against its return, not a reproduction. 2 real gloo workers,
launched several times.
"""

from __future__ import annotations

import pytest

from nbdist.testing import free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCHES = 6

SCRIPT = worker_source("exit_without_shutdown")


@pytest.mark.slow
def test_scripts_that_end_without_shutdown_exit_cleanly():
    failures = []
    for launch in range(LAUNCHES):
        port = free_port()
        results = run_workers(SCRIPT, [torchrun_env(r, 2, port) for r in range(2)], timeout=90)
        for rank, result in enumerate(results):
            assert result.reported and result.result == {"total": 2.0}, result.stderr[-2000:]
            if not result.ok or "terminate called" in result.stderr:
                failures.append(f"launch {launch} rank {rank}: {result.status()}\n"
                                f"{result.stderr[-500:]}")  # fmt: skip
    assert not failures, "\n".join(failures)
