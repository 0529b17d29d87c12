"""Functions run on the engines by more than one test file of tests/cluster (and its
`one_cluster` package); `TIMEOUT`, the strategy timeout those tests set.

Each is wrapped in `ipyparallel.interactive`, which makes it behave as if defined in a notebook:
its global names (`nd`, `torch`, `strategy`, variables set earlier) resolve in the engine's
namespace, and it is sent by value.
"""

from __future__ import annotations

import torch
from ipyparallel import interactive

import nbdist as nd

TIMEOUT = 60.0


@interactive
def replica_sums():
    ctx = nd.get_replica_context()
    r = ctx.replica_id_in_sync_group
    summed = ctx.all_reduce("sum", torch.tensor([1.0 + r, 10.0 * r]))
    gathered = ctx.all_gather(torch.tensor([float(r)]), axis=0)
    return summed, gathered, r, ctx.num_replicas_in_sync, strategy.num_replicas_in_sync  # noqa: F821


@interactive
def remember(value):
    global remembered
    remembered = value * 10


@interactive
def recall():
    return remembered


@interactive
def add(x, y, scale=1.0):
    return (x + y) * scale
