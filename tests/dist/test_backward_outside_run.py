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

pytestmark = pytest.mark.dist

SCRIPT = r"""
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
import nbdist as nd

strategy = nd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
out = {}


def params(module):
    return [p.detach().tolist() for p in module.parameters()]


def attempt(fn):
    try:
        fn()
    except Exception as error:
        return [type(error).__name__, str(error)]
    return None


data = torch.Generator().manual_seed(100 + rank)  # each worker its own data
X = torch.randn(4, 8, 10, generator=data)
Y = torch.randint(0, 5, (4, 8), generator=data)

torch.manual_seed(rank)
with strategy.scope():  # the DDP tutorial's ToyModel: 10-10-5
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.MSELoss()
target = lambda y: F.one_hot(y, 5).float()
out["local_grads"] = [
    g.tolist()
    for g in torch.autograd.grad(loss_fn(model(X[0]), target(Y[0])), list(model.parameters()))
]

# --- the literal port: a step at the top level, no strategy.run -------------------------------
optimizer.zero_grad()
loss_fn(model(X[0]), target(Y[0])).backward()
out["grads"] = [p.grad.tolist() for p in model.parameters()]
optimizer.step()
out["after_one_step"] = params(model)
# --- the same inside `with strategy.scope():` (cross-replica context) -------------------------
with strategy.scope():
    optimizer.zero_grad()
    loss_fn(model(X[1]), target(Y[1])).backward()
    optimizer.step()
out["after_scope_step"] = params(model)
# --- then strategy.run steps, still together ----------------------------------------------------
def step(x, y):
    optimizer.zero_grad()
    loss_fn(model(x), target(y)).backward()
    optimizer.step()
for i in (2, 3):
    strategy.run(step, args=(X[i], Y[i]))
out["after_run_steps"] = params(model)
out["check_when_equal"] = attempt(lambda: strategy.check_replicas_identical())

# --- parameters that differ anyway: named by the replica check ---------------------------------
with torch.no_grad():
    if rank == 1:
        model[2].bias[0] += 0.5
out["check_when_different"] = attempt(lambda: strategy.check_replicas_identical())
out["last_check"] = list(getattr(strategy, "last_replica_check", None) or [None])[1:]
with torch.no_grad():  # copying replica 0's values by hand works
    [p.copy_(strategy.extended.broadcast_from_first(p)) for p in model.parameters()]
out["check_after_fix"] = attempt(lambda: strategy.check_replicas_identical())
# A diverged model the user replaced (created again) is still the strategy's: the fix the
# message gives, strategy.realign_replicas(), covers it too.
with strategy.scope():
    old = torch.nn.Linear(3, 3)
with torch.no_grad():
    if rank == 1:
        old.bias[0] += 1.0
del old
out["check_replaced_model"] = attempt(lambda: strategy.check_replicas_identical())
strategy.realign_replicas()
out["check_after_realign"] = attempt(lambda: strategy.check_replicas_identical())

# --- gradients written by hand (never averaged): caught within replica_check_every steps ------
strategy.replica_check_every = 3
steps_taken = []


def hand_written_step(i):
    optimizer.zero_grad()
    grads = torch.autograd.grad(loss_fn(model(X[i]), target(Y[i])), list(model.parameters()))
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    optimizer.step()
    steps_taken.append(i)


out["periodic"] = attempt(lambda: [hand_written_step(i) for i in range(4)])
out["steps_before_periodic"] = len(steps_taken)
with torch.no_grad():
    [p.copy_(strategy.extended.broadcast_from_first(p)) for p in model.parameters()]

# --- DDP around a model made in scope: refused with the fix; around another model: as usual ----
from torch.nn.parallel import DistributedDataParallel as DDP
out["ddp_in_scope"] = attempt(lambda: DDP(model))
out["ddp_plain"] = attempt(lambda: DDP(torch.nn.Linear(3, 3)))

strategy.shutdown()
report(out)
"""


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


ONE_SIDED = r"""
import time
import torch
torch.set_num_threads(1)
import nbdist as nd

options = nd.experimental.CommunicationOptions(timeout_seconds=3)
strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
rank = strategy.cluster_resolver.task_id
with strategy.scope():
    model = torch.nn.Linear(4, 1)
out = None
if rank == 0:  # a backward on one worker only: it waits for the other, then names it
    start = time.perf_counter()
    try:
        model(torch.ones(2, 4)).sum().backward()
    except Exception as error:
        out = [type(error).__name__, str(error), time.perf_counter() - start]
else:
    time.sleep(8)
report(out)
"""


def test_backward_on_one_worker_only_names_the_missing_worker_after_the_timeout():
    port = free_port()
    results = run_workers(ONE_SIDED, [torchrun_env(r, 2, port) for r in range(2)], timeout=60)
    assert_all_ok(results)
    name, message, elapsed = results[0].result
    assert name == "CollectiveTimeoutError"
    assert "gradient all_reduce" in message and "rank 1 never called this collective" in message
    assert elapsed < 30
