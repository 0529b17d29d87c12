"""The demo's training step on 2 gloo workers against hand-written DDP on the same batches.

`nbdist demo` trains with `MultiWorkerMirroredStrategy`'s gradient buckets
(`nbdist.strategies._grad_buckets`), not DDP's reducer (docs/architecture.md, "The data path
of a gradient", says why). Whatever path the gradients take, the demo's CNN trained with the
demo's own step and distributed iterator must end where `DistributedDataParallel` ends on the
batches each replica got: bit for bit at 2 workers (DDP divides each rank's gradient by 2 and
sums; nbdist sums and multiplies by 0.5: both exact in binary floating point, and a sum of two
terms does not depend on their order), and telemetry must still record every gradient
all-reduce, once per backward, with the bytes of the parameters.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

SCRIPT = worker_source("demo_step_vs_ddp")


@pytest.fixture(scope="module")
def trained(launch_once) -> list[dict]:
    def launch():
        port = free_port()
        envs = [torchrun_env(rank, 2, port) for rank in range(2)]
        return run_workers(SCRIPT, envs, timeout=120, fail_fast=True)

    results = launch_once("demo-step-vs-ddp", launch)
    assert_all_ok(results)
    return [result.result for result in results]


def test_demo_step_ends_bit_identical_to_ddp_on_the_same_batches(trained):
    first, second = trained
    assert first["steps"] == second["steps"] == 2 * first["steps_per_epoch"] == 46
    assert first["rows"] != second["rows"]  # each worker took its own half of the batches
    for out in trained:
        assert out["nbdist"] == out["ddp"]  # exact: no tolerance (see the module docstring)
    assert first["nbdist"] == second["nbdist"]  # and the replicas agree


def test_telemetry_records_every_gradient_all_reduce(trained):
    for out in trained:
        records = out["gradient_records"]
        assert len(records) == out["steps"]  # one per backward
        assert {nbytes for _, nbytes in records} == {out["parameter_bytes"]}
        assert out["recorded"].count("gradient all_reduce") == out["steps"]
