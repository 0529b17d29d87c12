"""`nd.Cluster(strategy="fully_sharded")`: engines whose `strategy` is a `FullyShardedStrategy`.

Two real engines train a 4-block MLP created in `strategy.scope()`: each engine holds half the
rows of every parameter, the gathered parameters are the same on both and the loss goes down;
`cluster.strategy.run` of a function returning a sharded parameter brings back each engine's
local shard.
"""

from __future__ import annotations

import pytest
import torch

import nbdist as nd

pytestmark = pytest.mark.cluster

TRAIN = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()) for _ in range(4)],
        torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
rank = strategy.cluster_resolver.task_id
g = torch.Generator().manual_seed(1)
X, Y = torch.randn(20, 16, 32, generator=g), torch.randint(0, 4, (20, 16), generator=g)
losses = []
for i in range(20):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X[0, rank * 8:(rank + 1) * 8]), Y[0, rank * 8:(rank + 1) * 8])
    loss.backward()
    optimizer.step()
    losses.append(float(loss))
kind = type(strategy).__name__
rows = [[p.to_local().shape[0], p.shape[0]] for p in model.parameters()]
gathered = [strategy.gather(p).tolist() for p in model.parameters()]
"""


@pytest.fixture(scope="module")
def cluster(start_cluster):
    return start_cluster(strategy="fully_sharded")


def test_engines_train_a_sharded_model(cluster):
    cluster.client[:].execute(TRAIN, block=True)
    assert list(cluster.pull("kind").values) == ["FullyShardedStrategy"] * 2
    for rows in cluster.pull("rows").values:
        assert all(local * 2 == whole for local, whole in rows)
    first, second = cluster.pull("gathered").values
    assert all(torch.equal(torch.tensor(a), torch.tensor(b)) for a, b in zip(first, second))
    for losses in cluster.pull("losses").values:
        assert sum(losses[-5:]) < sum(losses[:5])
    shards = cluster.strategy.run(lambda m: m[0][0].weight, args=(nd.remote("model"),)).values
    assert [tuple(s.shape) for s in shards] == [(16, 32), (16, 32)]
    whole = torch.tensor(first[0])
    assert torch.equal(torch.cat(shards), whole)
