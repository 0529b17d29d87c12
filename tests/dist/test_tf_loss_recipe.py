"""TensorFlow's custom-training recipe (`compute_average_loss` over the global batch plus
`scale_regularization_loss`) on 2 real gloo workers: the gradient each worker applies is the
one-device gradient of the global-batch mean, the reported loss (the SUM over replicas) is the
one-device loss, and 5 SGD steps end where one device ends. The same formula written out
without nbdist's functions gives exactly half the gradient (nbdist averages, TF sums)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

GLOBAL_BATCH = 16
STEPS = 5
L2 = 0.01

RECIPE = worker_source("tf_loss_recipe")


def _one_device() -> dict:
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(GLOBAL_BATCH, 6, generator=g),
            torch.randint(0, 3, (GLOBAL_BATCH,), generator=g),
        )
        for _ in range(STEPS)
    ]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = {"losses": [], "grads": []}
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y) + L2 * model[0].weight.square().sum()
        loss.backward()
        out["losses"].append(loss.item())
        out["grads"].append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    return out


@pytest.fixture(scope="module")
def workers(launch_once) -> list[dict]:
    def launch():
        port = free_port()
        envs = [torchrun_env(rank, 2, port) for rank in range(2)]
        return run_workers(RECIPE, envs, timeout=90, fail_fast=True)

    results = launch_once("tf-loss-recipe", launch)
    assert_all_ok(results)
    return [result.result for result in results]


def _close(got: list, want: torch.Tensor, scale: float = 1.0) -> None:
    torch.testing.assert_close(torch.tensor(got), want * scale, rtol=1e-5, atol=1e-6)


def test_each_step_applies_the_one_device_gradient_of_the_global_mean(workers):
    reference = _one_device()
    for worker in workers:
        for step_grads, want_grads in zip(worker["grads"], reference["grads"]):
            for got, want in zip(step_grads, want_grads):
                _close(got, want)
    assert workers[0]["grads"] == workers[1]["grads"]


def test_the_reported_loss_is_the_one_device_loss(workers):
    reference = _one_device()
    for worker in workers:
        assert worker["losses"] == pytest.approx(reference["losses"], rel=1e-5)


def test_the_workers_end_where_one_device_ends(workers):
    reference = _one_device()
    assert workers[0]["params"] == workers[1]["params"]  # bit-identical
    for got, want in zip(workers[0]["params"], reference["params"]):
        _close(got, want)


def test_the_formula_written_out_gives_half_the_gradient(workers):
    """What TF's tutorial ported literally gave before nd.compute_average_loss: 0.5x."""
    reference = _one_device()
    for worker in workers:
        for got, want in zip(worker["literal_grads"], reference["grads"][0]):
            _close(got, want, scale=0.5)


def test_outside_run_a_given_global_batch_size_is_scaled_for_the_workers_averaging(workers):
    """Worker r's loss is sum(x_r) / 8; nbdist averages the 2 workers' gradients, so each must
    be 2 * sum(x_r) / 8 for the average to be the global mean's (sum(1..8) / 8 = 4.5)."""
    first, second = workers
    assert first["outside_run_grad_given"] == 2 * (1 + 2 + 3 + 4) / 8
    assert second["outside_run_grad_given"] == 2 * (5 + 6 + 7 + 8) / 8
    assert (first["outside_run_grad_given"] + second["outside_run_grad_given"]) / 2 == 4.5
    assert first["outside_run_grad_default"] == 2.5  # the worker's own mean: 2.5 | 6.5
    assert second["outside_run_grad_default"] == 6.5
