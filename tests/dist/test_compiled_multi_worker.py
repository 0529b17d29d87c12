"""Compiled steps with MultiWorkerMirroredStrategy across 2 real worker processes (docs/compile.md).

Each worker trains on its own data with `strategy.run(torch.compile(step))` (aot_eager); the
workers stay bit-identical after every step, and 2-worker training equals one process that
compiles the same step over the global batch (to 1e-5). A `fullgraph=True` step around a
collective fails on both workers with CompiledCollectiveError, and neither hangs.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 180

CODE = worker_source("compiled_multi_worker")


@pytest.fixture(scope="module")
def results():
    port = free_port()
    envs = [torchrun_env(rank, 2, port) for rank in range(2)]
    outcome = run_workers(CODE, envs, timeout=LAUNCH_TIMEOUT, fail_fast=True)
    assert_all_ok(outcome)
    return [r.result for r in outcome]


def test_compiled_step_keeps_workers_identical_and_equals_one_process(results):
    assert results[0]["snapshots"] == results[1]["snapshots"]
    for worker in results:
        assert worker["diff"] < 1e-5


def test_fullgraph_collective_is_refused_on_every_worker_without_a_hang(results):
    for worker in results:
        assert worker["refused"] is not None
        assert "fullgraph=True" in worker["refused"] and "without" in worker["refused"]
        assert worker["after"] == [2.0, 2.0]
