"""Compiled steps with MultiWorkerMirroredStrategy across 2 real worker processes (docs/compile.md).

Each worker trains on its own data with `strategy.run(torch.compile(step))` (aot_eager); the
workers stay bit-identical after every step, and 2-worker training equals one process that
compiles the same step over the global batch (to 1e-5). A `fullgraph=True` step around a
collective fails on both workers with CompiledCollectiveError, and neither hangs.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 180

CODE = r"""
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
import nbdist as nd
from nbdist.errors import CompiledCollectiveError

strategy = nd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
STEPS, PER_WORKER = 5, 16
data = torch.Generator().manual_seed(7)
X = torch.randn(STEPS, 2 * PER_WORKER, 8, generator=data)
Y = torch.randint(0, 3, (STEPS, 2 * PER_WORKER), generator=data)


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def compiled_step(model, optimizer):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return torch.compile(step, backend="aot_eager")


# one process, the global batch: the reference
reference = make()
ref_step = compiled_step(reference, torch.optim.SGD(reference.parameters(), lr=0.2))
for x, y in zip(X, Y):
    ref_step(x, y)

with strategy.scope():
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
step = compiled_step(model, optimizer)
snapshots = []
for x, y in zip(X, Y):
    mine = slice(rank * PER_WORKER, (rank + 1) * PER_WORKER)
    strategy.run(step, args=(x[mine], y[mine]))
    snapshots.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist())
diff = max(
    (a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters())
)

body = torch.compile(
    lambda t: nd.get_replica_context().all_reduce("sum", t), backend="aot_eager", fullgraph=True
)
try:
    strategy.run(body, args=(torch.ones(2),))
    refused = None
except CompiledCollectiveError as error:
    refused = str(error)
after = strategy.run(lambda t: nd.get_replica_context().all_reduce("sum", t), args=(torch.ones(2),))
report({"snapshots": snapshots, "diff": diff, "refused": refused, "after": after.tolist()})
"""


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
