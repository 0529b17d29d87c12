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

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 60

STEPS = r"""
import warnings
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
import nbdist as nd

strategy = nd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
out = {}


def params(module):
    return [p.detach().tolist() for p in module.parameters()]


def local_grads(module, x, y):
    # This worker's own gradient, outside run (no accumulation into .grad, no averaging).
    loss = F.cross_entropy(module(x), y)
    return [g.tolist() for g in torch.autograd.grad(loss, list(module.parameters()))]


data = torch.Generator().manual_seed(100 + rank)  # different data on each worker
X = torch.randn(10, 16, 8, generator=data)
Y = torch.randint(0, 3, (10, 16), generator=data)

# --- synchronised: 10 steps on different data stay bit-identical -------------------------------
torch.manual_seed(rank)  # different initial weights: the scope must broadcast worker 0's
with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
out["initial"] = params(model)
out["local_grads_step0"] = local_grads(model, X[0], Y[0])


def step(x, y, capture):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad.tolist() for p in model.parameters()] if capture else None
    optimizer.step()
    return loss.detach(), grads


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    losses = []
    for i in range(10):
        loss, grads = strategy.run(step, args=(X[i], Y[i], i == 0))
        losses.append(loss.item())
        if i == 0:
            out["synced_grads_step0"] = grads
out["warnings_in_scope"] = [str(w.message) for w in caught]
out["losses"] = losses
out["final"] = params(model)

# --- sync_gradients=False: broadcast at scope exit, but gradients stay local -------------------
torch.manual_seed(10 + rank)
with strategy.scope(sync_gradients=False):
    free = torch.nn.Linear(8, 3)
out["free_initial"] = params(free)
out["free_local_grads"] = local_grads(free, X[0], Y[0])


def free_step(x, y):
    free.zero_grad()
    F.cross_entropy(free(x), y).backward()
    grads = [p.grad.clone() for p in free.parameters()]
    averaged = nd.get_replica_context().all_reduce("mean", grads)  # reduce them yourself
    return [g.tolist() for g in grads], [g.tolist() for g in averaged]


out["free_grads"], out["free_averaged"] = strategy.run(free_step, args=(X[0], Y[0]))

# --- a model created outside the scope, trained in run: one UserWarning -----------------------
torch.manual_seed(0)
outside = torch.nn.Linear(8, 3)
outside_optimizer = torch.optim.SGD(outside.parameters(), lr=0.1)


def outside_step(x, y):
    outside_optimizer.zero_grad()
    F.cross_entropy(outside(x), y).backward()
    outside_optimizer.step()


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(3):
        strategy.run(outside_step, args=(X[i], Y[i]))
out["outside_warnings"] = [[w.category.__name__, str(w.message)] for w in caught]

strategy.shutdown()
report(out)
"""

DIGITS = r"""
import os
import torch
import torch.nn.functional as F
import torch.utils.data as tud
torch.set_num_threads(1)
import nbdist as nd

GLOBAL_BATCH = 64
strategy = nd.MultiWorkerMirroredStrategy()
features, labels = torch.load(os.environ["DIGITS_PATH"])  # sklearn's digits, from the test
index = torch.arange(len(labels))
loader = tud.DataLoader(
    tud.TensorDataset(features, labels, index), batch_size=GLOBAL_BATCH, shuffle=True,
    generator=torch.Generator().manual_seed(0),
)
torch.manual_seed(1234)
with strategy.scope():
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def step(x, y):
    optimizer.zero_grad()
    # Scaled so that averaging over replicas gives the global batch's loss (TF's recipe): also
    # right for the last, partial batch (1797 = 28 * 64 + 5, split 3 | 2 over 2 workers).
    per_example = F.cross_entropy(model(x), y, reduction="none")
    loss = per_example.sum() * strategy.num_replicas_in_sync / GLOBAL_BATCH
    loss.backward()
    optimizer.step()
    return loss.detach()


seen = []
dist_loader = strategy.experimental_distribute_dataset(loader)
for epoch in range(2):
    for x, y, i in dist_loader:
        strategy.run(step, args=(x, y))
        seen.append(i.tolist())
report({
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
    "steps": len(dist_loader),
    "seen": seen,
    "params": [p.detach().tolist() for p in model.parameters()],
})
strategy.shutdown()
"""


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
        assert category == "UserWarning"
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


TWO_MODELS = r"""
import torch
torch.set_num_threads(1)
import nbdist as nd

strategy = nd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
with strategy.scope():
    first = torch.nn.Linear(4, 1)
with strategy.scope():
    second = torch.nn.Linear(4, 1)
x = torch.ones(2, 4) * (rank + 1)
strategy.run(lambda: first(x).sum().backward())
first_grad = first.weight.grad.clone()
strategy.run(lambda: second(x).sum().backward())  # a separate backward, as in a GAN
report({
    "first": first_grad.tolist(),
    "first_after": first.weight.grad.tolist(),
    "second": second.weight.grad.tolist(),
    "telemetry": [r.nbytes for r in strategy.extended.telemetry.records()
                  if r.op == "gradient_sync"],
})
strategy.shutdown()
"""


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
