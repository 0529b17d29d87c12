"""`nd.checkpoint` of `FullyShardedStrategy` state across real worker processes (gloo, CPU).

A chain of four launches: 2 sharded workers save a DCP directory mid-run; 3 workers restore it
(each with a third of the rows) and train on to the parameters of the uninterrupted 2-worker
run; 4 workers restore that into a mirrored model, save it as one file, restore the file into
a sharded model and save again; 2 workers restore the 4-worker checkpoint. Every restore gives
the saved values exactly; a checkpoint of another model is refused by name.
"""

from __future__ import annotations

import pytest
import torch

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 180
WORKER = worker_source("checkpoint_sharded")


def _launch(phase: str, workers: int, folder: str) -> list[dict]:
    port = free_port()
    envs = [
        {**torchrun_env(rank, workers, port), "PHASE": phase, "DIR": folder}
        for rank in range(workers)
    ]
    results = run_workers(WORKER, envs, timeout=LAUNCH_TIMEOUT)
    assert_all_ok(results)
    return [result.result for result in results]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sharded-ckpt"))
    return {
        "train2": _launch("train2", 2, folder),
        "resume3": _launch("resume3", 3, folder),
        "mirror4": _launch("mirror4", 4, folder),
        "shard2": _launch("shard2", 2, folder),
    }


def _difference(a: list, b: list) -> float:
    return max(float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b))


def test_a_sharded_checkpoint_is_a_dcp_directory_written_by_every_worker(chain):
    assert chain["train2"][0]["c1_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                              "nbdist.pt"]  # fmt: skip


def test_saved_on_two_workers_resumes_on_three(chain):
    saved, uninterrupted = chain["train2"][0]["saved"], chain["train2"][0]["uninterrupted"]
    for out in chain["resume3"]:
        assert _difference(out["restored"], saved) == 0.0
        assert out["progress"] == {"step": 5}
        # each block's 24 rows in thirds (the head's 4 rows split 2, 2, 0)
        assert all(local * 3 == rows for local, rows in out["rows"] if rows == 24)
        # Adam's moments came back too: the run goes on as if never interrupted
        assert _difference(out["resumed"], uninterrupted) <= 1e-5


def test_restores_into_a_mirrored_model_and_back(chain):
    resumed = chain["resume3"][0]["resumed"]
    for out in chain["mirror4"]:
        assert _difference(out["mirrored_restored"], resumed) == 0.0
        assert out["mirrored_state_steps"] == [10.0] * 10
        assert out["c3_is_file"]  # a mirrored model's checkpoint is one file
        assert _difference(out["sharded_restored"], resumed) == 0.0
        assert out["sharded_state_local"]  # the optimizer state is sharded again


def test_saved_on_four_workers_restores_on_two(chain):
    resumed = chain["resume3"][0]["resumed"]
    for out in chain["shard2"]:
        assert _difference(out["restored"], resumed) == 0.0


def test_another_model_is_refused_by_name(chain):
    for out in chain["shard2"]:
        assert "does not fit: model.0.weight is not in the checkpoint" in out["wrong"]
        assert "is sharded (a directory of torch.distributed.checkpoint shards)" in out["read"]
