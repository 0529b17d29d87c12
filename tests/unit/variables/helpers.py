"""Strategies and readers shared by the tests of nd.Variable, MirroredVariable and
SyncOnReadVariable (API.md §5, §11). Every multi-replica case runs on two logical CPU devices,
so it needs no GPU.
"""

from __future__ import annotations

import torch

import nbdist as nd

AGG = nd.VariableAggregation
SYNC = nd.VariableSynchronization


def mirrored() -> nd.MirroredStrategy:
    """A MirroredStrategy over two logical CPU devices (two replicas, no GPU needed)."""
    return nd.MirroredStrategy(["cpu:0", "cpu:1"])


def replica_id() -> int:
    """The id of the replica running this (inside `strategy.run`)."""
    return nd.get_replica_context().replica_id_in_sync_group


def components(variable) -> list[list[float]]:
    """The value of each of a distributed variable's components, in replica order."""
    return [c.value().tolist() for c in variable.values]


def sync_on_read(strategy, aggregation):
    """A SyncOnRead variable whose components are [1, 2] and [2, 4] (written in replica context)."""
    with strategy.scope():
        v = nd.Variable([0.0, 0.0], synchronization="ON_READ", aggregation=aggregation)
    strategy.run(lambda: v.assign(torch.tensor([1.0, 2.0]) * (replica_id() + 1)))
    return v
