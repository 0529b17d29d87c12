"""`nd.experimental.FullyShardedStrategy` across real worker processes (gloo, CPU).

A 4-block MLP trained 20 steps with the sharded strategy ends at the parameters (gathered) of
`MultiWorkerMirroredStrategy` on the same data, on 2 and 4 workers; each worker holds 1/N of
the rows of every parameter, and 1/N of the mirrored strategy's parameter, gradient and Adam
state bytes; the all-gathers and reduce-scatters are in the telemetry and the recorder. On 2
workers also: the DTensor reduction rules, mixed precision, `torch.compile`, and the bad
inputs (a module made outside scope, a policy that chooses nothing, tied parameters).
"""

from __future__ import annotations

import pytest
import torch

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 240
WORKER = worker_source("fully_sharded")


@pytest.fixture(scope="module", params=[2, 4], ids=["2-workers", "4-workers"])
def outs(request, launch_once):
    workers = request.param
    rows = launch_once(f"fully-sharded-{workers}", lambda: _launch_results(workers))
    return workers, [row.result for row in rows]


def _launch_results(workers: int):
    port = free_port()
    envs = [
        {**torchrun_env(rank, workers, port), "EXTRA": "1" if workers == 2 else "0",
         "STEPS": "20"}
        for rank in range(workers)
    ]  # fmt: skip
    results = run_workers(WORKER, envs, timeout=LAUNCH_TIMEOUT)
    assert_all_ok(results)
    return results


def _max_difference(a: list, b: list) -> float:
    return max(float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b))


def test_sharded_training_ends_at_the_mirrored_parameters(outs):
    workers, results = outs
    for out in results:
        assert len(out["sharded"]) == len(out["mirrored"]) == 10
        assert _max_difference(out["sharded"], out["mirrored"]) <= 1e-5
        assert out["sharded_losses"] == pytest.approx(out["mirrored_losses"], abs=1e-5)
        assert out["optimizer_on_shards"]
    # every worker gathers the same whole parameters
    assert _max_difference(results[0]["sharded"], results[-1]["sharded"]) == 0.0


def test_each_worker_holds_one_nth_of_the_rows(outs):
    workers, results = outs
    for out in results:
        assert len(out["rows"]) == 10  # every parameter is sharded
        for local, whole in out["rows"]:
            assert local == whole // workers


def test_bytes_per_worker_are_one_nth_of_the_mirrored(outs):
    workers, results = outs
    for out in results:
        assert out["sharded_bytes"] * workers == out["mirrored_bytes"]
        local = out["local_bytes"]
        assert local["parameters"] + local["gradients"] + local["optimizer"] == (
            out["sharded_bytes"]
        )
        # the dashboard's placement view: this replica's shard bytes
        assert out["holdings"] == [["parameter shards", local["parameters"]]]


def test_units_and_recorded_collectives(outs):
    workers, results = outs
    for out in results:
        # min_shard_bytes=1024: each block's Linear, the head, then the root
        assert out["units"] == ["FSDPLinear"] * 4 + ["FSDPSequential"]
        assert "all_gather:shards" in out["ops"] and "reduce_scatter:AVG" in out["ops"]
        assert {"all_gather:shards", "reduce_scatter:AVG"} <= set(out["recorded"])
        assert out["all_gathers"] >= 20 * 5  # one per unit per forward at least


@pytest.fixture(scope="module")
def two(launch_once):
    """The 2-worker launch (shared with `outs`), which also ran the EXTRA checks."""
    return [row.result for row in launch_once("fully-sharded-2", lambda: _launch_results(2))]


def test_a_sharded_parameter_reduces_as_one_whole_value(two):
    for out in two:
        assert out["reduce_sum_is_n_times"] and out["reduce_mean_is_whole"]
        assert out["run_returns"] == "DTensor"


def test_a_module_made_outside_scope_is_named_in_run(two):
    for out in two:
        assert out["outside"].startswith("Sequential passed to strategy.run has 10 parameter(s)")
        assert "created outside FullyShardedStrategy.scope()" in out["outside"]
        assert out["outside_step"] == "NotShardedError"


def test_parameters_are_shards_again_after_an_evaluation_forward(two):
    for out in two:
        assert out["sharded_after_eval"]


def test_auto_falls_back_to_the_root_blocks_below_the_size(two):
    for out in two:
        # the root, its four blocks and the head: no subtree reaches 1 MiB
        assert out["small_units"] == ["FSDPSequential"] + ["FSDPBlock"] * 4 + ["FSDPLinear"]


def test_a_policy_that_chooses_nothing_warns_and_still_shards_the_root(two):
    for out in two:
        (message,) = out["nothing_warning"]
        assert message.startswith("The shard policy chose no module inside Sequential")
        assert out["nothing_sharded"]


def test_tied_parameters_train_in_the_root_unit_or_are_named(two):
    for out in two:
        assert out["tied_same_object"]
        # blocks 0 and 3 share a weight: "auto" leaves both to the root
        assert out["tied_units"] == ["FSDPLinear"] * 2 + ["FSDPSequential"]
        assert "'0.lin.weight = 3.lin.weight' is also used outside it" in out["tied_callable"]


def test_mixed_precision_computes_in_bfloat16_on_float32_shards(two):
    for out in two:
        assert out["mixed_param_dtype"] == "torch.float32"
        assert out["mixed_output_dtype"] == "torch.bfloat16"
        assert out["mixed_grad_dtype"] == "torch.float32"  # reduced in float32
        # the same first step as float32, to bfloat16's precision through five layers
        assert abs(out["mixed_losses"][0] - out["sharded_losses"][0]) < 0.1
        assert all(0.5 < loss < 3 for loss in out["mixed_losses"])


def test_torch_compile_of_a_sharded_model_works(two):
    for out in two:
        assert out["compile"] is True
