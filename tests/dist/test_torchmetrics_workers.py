"""torchmetrics on 2 real gloo workers (`MultiWorkerMirroredStrategy` under torchrun
variables): metrics made in `strategy.scope()` (as TF's tutorials make theirs) and updated
inside `strategy.run` on each worker's share of every global batch; `compute()` gives both
workers the one-device value (torchmetrics gathers the states over nbdist's process group).
The per-replica recipe of docs/metrics.md gives the same in several processes.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

METRICS = worker_source("torchmetrics")


def test_torchmetrics_agree_across_workers_and_equal_one_device():
    port = free_port()
    results = run_workers(METRICS, [torchrun_env(rank, 2, port) for rank in range(2)], timeout=90)
    assert_all_ok(results)
    outs = [result.result for result in results]
    assert [out["seen"] for out in outs] == [[8, 8, 8, 1], [8, 8, 8, 1]]  # each a share
    for out in outs:
        assert out["accuracy"] == out["one_device_accuracy"]
        assert abs(out["mean_loss"] - out["one_device_loss"]) < 1e-6
        assert abs(out["per_replica"] - out["one_device_loss"]) < 1e-6
    assert outs[0]["accuracy"] == outs[1]["accuracy"]
    assert outs[0]["mean_loss"] == outs[1]["mean_loss"]
