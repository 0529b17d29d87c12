"""Training with MultiWorkerMirroredStrategy across 2 real worker processes.

A model built in `strategy.scope()` is broadcast from worker 0 and its gradients are averaged
across workers during backward, so the workers stay bit-identical on different data, and
2-worker training at a global batch matches 1-worker training at the same global batch.
"""

from __future__ import annotations

import os

import pytest
import torch

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 60

STEPS = worker_source("multi_worker_training_steps")

DIGITS = worker_source("multi_worker_training_digits")


def _launch(code: str, **extra: str):
    port = free_port()
    envs = [{**torchrun_env(rank, 2, port), **extra} for rank in range(2)]
    return run_workers(code, envs, timeout=LAUNCH_TIMEOUT, fail_fast=True)


def _tensors(values: list) -> list[torch.Tensor]:
    return [torch.tensor(v) for v in values]


@pytest.fixture(scope="module")
def steps(launch_once) -> list[dict]:
    results = launch_once("training-steps", lambda: _launch(STEPS))
    assert_all_ok(results)
    return [result.result for result in results]


def test_parameters_bit_identical_after_10_steps_on_different_data(steps):
    first, second = steps
    assert first["initial"] == second["initial"]  # worker 0's weights broadcast at scope exit
    assert first["losses"] != second["losses"]  # the data differ
    assert first["final"] == second["final"]  # exact, not approximately equal
    assert first["final"] != first["initial"]  # and it did train
    assert first["warnings_in_scope"] == second["warnings_in_scope"] == []


def test_gradients_are_the_average_of_the_workers_gradients(steps):
    first, second = steps
    assert first["synced_grads_step0"] == second["synced_grads_step0"]
    for synced, g0, g1 in zip(
        _tensors(first["synced_grads_step0"]),
        _tensors(first["local_grads_step0"]),
        _tensors(second["local_grads_step0"]),
    ):
        assert not torch.equal(g0, g1)
        torch.testing.assert_close(synced, (g0 + g1) / 2, rtol=0, atol=1e-6)


def test_sync_gradients_false_leaves_gradients_local(steps):
    first, second = steps
    assert first["free_initial"] == second["free_initial"]  # still broadcast at scope exit
    assert first["free_grads"] != second["free_grads"]
    for out in steps:
        for grad, local in zip(_tensors(out["free_grads"]), _tensors(out["free_local_grads"])):
            torch.testing.assert_close(grad, local, rtol=0, atol=1e-6)
    assert first["free_averaged"] == second["free_averaged"]
    for averaged, g0, g1 in zip(
        _tensors(first["free_averaged"]),
        _tensors(first["free_grads"]),
        _tensors(second["free_grads"]),
    ):
        torch.testing.assert_close(averaged, (g0 + g1) / 2, rtol=0, atol=1e-6)


def test_model_created_outside_scope_warns_once(steps):
    for out in steps:
        assert len(out["outside_warnings"]) == 1, out["outside_warnings"]
        category, message = out["outside_warnings"][0]
        assert category == "NbdistWarning"  # nbdist.errors.NbdistWarning, a UserWarning
        assert "outside" in message and "strategy.scope()" in message


def test_two_workers_on_digits_match_one_worker_at_the_same_global_batch(monkeypatch, tmp_path):
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    path = tmp_path / "digits.pt"
    features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    torch.save((features, torch.tensor(digits.target)), path)
    results = _launch(DIGITS, DIGITS_PATH=str(path))
    assert_all_ok(results)
    two = [result.result for result in results]

    # One worker: the same script in this process, with no cluster in the environment.
    for name in list(os.environ):
        if name in ("TF_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK") or name.startswith(
            ("MASTER_", "SLURM_", "TORCHELASTIC_")
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DIGITS_PATH", str(path))
    captured = []
    exec(DIGITS, {"__name__": "__main__", "report": captured.append})
    (one,) = captured

    assert one["num_replicas_in_sync"] == 1
    assert [out["num_replicas_in_sync"] for out in two] == [2, 2]
    assert one["steps"] == two[0]["steps"] == two[1]["steps"] == 29  # ceil(1797 / 64)
    # Each worker took its half of every global batch, in order (32 | 32, last 3 | 2).
    assert len(one["seen"]) == 58
    for step, batch in enumerate(one["seen"]):
        half = (len(batch) + 1) // 2
        assert two[0]["seen"][step] == batch[:half], step
        assert two[1]["seen"][step] == batch[half:], step
    assert two[0]["params"] == two[1]["params"]
    for p1, p2 in zip(_tensors(one["params"]), _tensors(two[0]["params"])):
        torch.testing.assert_close(p2, p1, rtol=0, atol=1e-5)


TWO_MODELS = worker_source("multi_worker_training_two_models")


def test_models_trained_by_separate_backwards_keep_their_own_gradients():
    port = free_port()
    results = run_workers(TWO_MODELS, [torchrun_env(r, 2, port) for r in range(2)],
                          timeout=LAUNCH_TIMEOUT)  # fmt: skip
    assert_all_ok(results)
    for worker in results:
        out = worker.result
        assert out["first"] == [[3.0, 3.0, 3.0, 3.0]]  # mean of 2 and 4 per element
        assert out["first_after"] == out["first"]  # untouched by the second model's backward
        assert out["second"] == [[3.0, 3.0, 3.0, 3.0]]
        # each backward all-reduced only its own model's bucket (4 weights + 1 bias, float32)
        assert out["telemetry"] == [20, 20]
