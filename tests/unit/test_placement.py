"""The declared strategy interface of the cross-replica rules (nbdist/core/reduce/placement.py)."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.core.reduce import rules as reduction
from nbdist.core.reduce.placement import Placement, SingleWorker, WorkerCommunication

STRATEGIES = {
    "default": lambda: nd.get_strategy(),
    "one_device": lambda: nd.OneDeviceStrategy("cpu:0"),
    "mirrored": lambda: nd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "central_storage": lambda: nd.experimental.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    "multi_worker_single": lambda: nd.MultiWorkerMirroredStrategy(),
}


@pytest.mark.parametrize("make", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_every_strategys_extended_implements_the_interface(make):
    strategy = make()
    extended = strategy.extended
    assert isinstance(extended, WorkerCommunication)
    placement = extended.placement
    assert placement.num_replicas_in_sync == strategy.num_replicas_in_sync
    assert placement.devices == extended.worker_devices
    assert placement.parameter_devices == extended.parameter_devices
    one = torch.tensor([1.0, 2.0])
    assert torch.equal(extended.across_workers("sum", one), one)  # one worker: itself
    assert torch.equal(extended.gather_across_workers(one, 0), one)
    assert torch.equal(extended.broadcast_from_first(one), one)
    assert extended.reduction_ops() is extended.reduction_ops()
    assert extended.communication_options() is not None


def test_single_worker_serves_the_rules_without_a_strategy():
    workers = SingleWorker(Placement(devices=("cpu",) * 3))
    assert isinstance(workers, WorkerCommunication)
    value = nd.PerReplica([torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])])
    assert reduction.reduce_value(workers, nd.ReduceOp.MEAN, value, None).item() == 2.0
    assert reduction.gather_value(workers, value, 0).tolist() == [1.0, 2.0, 3.0]
    assert workers.placement.local_replica_ids == (0, 1, 2)
