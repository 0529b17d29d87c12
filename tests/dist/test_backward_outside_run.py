"""A DDP-style step outside `strategy.run` under torchrun: averaged, never silently diverged.

The literal port of PyTorch's DDP tutorial (model and optimizer made in `strategy.scope()`,
then `opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()` with no `strategy.run`,
each worker on its own data) must leave the workers' parameters bit-identical, with gradients
equal to the average of the workers' own. Parameters that differ anyway (changed on one worker
only) are reported by the replica check as `ReplicasDivergedError` on every worker, at the
check and after every `replica_check_every` optimizer steps. `DistributedDataParallel` around
a model made in scope is refused with the fix. Real gloo workers on 127.0.0.1.
"""

from __future__ import annotations

import pytest
import torch

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

SCRIPT = worker_source("backward_outside_run")


@pytest.fixture(scope="module")
def workers(launch_once) -> list[dict]:
    def launch():
        port = free_port()
        return run_workers(SCRIPT, [torchrun_env(r, 2, port) for r in range(2)], timeout=90,
                           fail_fast=True)  # fmt: skip

    results = launch_once("backward-outside-run", launch)
    assert_all_ok(results)
    return [result.result for result in results]


def test_step_outside_run_averages_the_gradients_and_keeps_workers_identical(workers):
    first, second = workers
    assert first["local_grads"] != second["local_grads"]  # the data differ
    assert first["grads"] == second["grads"]
    for synced, g0, g1 in zip(first["grads"], first["local_grads"], second["local_grads"]):
        expected = (torch.tensor(g0) + torch.tensor(g1)) / 2
        torch.testing.assert_close(torch.tensor(synced), expected, rtol=0, atol=1e-6)
    for key in ("after_one_step", "after_scope_step", "after_run_steps"):
        assert first[key] == second[key], key  # bit-identical, not approximately
    assert first["check_when_equal"] is None


def test_replica_check_names_the_differing_parameter_on_every_worker(workers):
    for out in workers:
        name, message = out["check_when_different"]
        assert name == "ReplicasDivergedError"
        assert "1 of 4 parameter(s)" in message and "Linear.bias [5]" in message
        assert "strategy.realign_replicas()" in message
        assert out["last_check"] == [False, message]
        assert out["check_after_fix"] is None
        name, message = out["check_replaced_model"]
        assert name == "ReplicasDivergedError" and "Linear.bias [3]" in message
        assert out["check_after_realign"] is None


def test_gradients_written_by_hand_are_caught_by_the_periodic_check(workers):
    for out in workers:
        name, message = out["periodic"]
        assert name == "ReplicasDivergedError"
        assert "after optimizer step" in message and "torch.autograd.grad" in message
        # 4 earlier steps (1 outside run, 1 in scope, 2 in run) + 2 here = the 6th step
        assert out["steps_before_periodic"] == 1


def test_ddp_of_a_model_made_in_scope_is_refused_naming_the_fix(workers):
    for out in workers:
        name, message = out["ddp_in_scope"]
        assert name == "RedundantDDPError"
        assert "already averages" in message and "Drop the wrapper" in message
        assert out["ddp_plain"] is None


ONE_SIDED = worker_source("backward_outside_run_one_sided")


def test_backward_on_one_worker_only_names_the_missing_worker_after_the_timeout():
    port = free_port()
    results = run_workers(ONE_SIDED, [torchrun_env(r, 2, port) for r in range(2)], timeout=60)
    assert_all_ok(results)
    name, message, elapsed = results[0].result
    assert name == "CollectiveTimeoutError"
    assert "gradient all_reduce" in message and "rank 1 never called this collective" in message
    assert elapsed < 30
