"""Variables of CentralStorageStrategy: one component on the parameter device, aggregated replica
writes (API.md §5).
"""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from tests.unit.variables.helpers import AGG, SYNC, components, replica_id, sync_on_read


def test_central_storage_variable_has_one_component_on_the_parameter_device():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable([1.0, 2.0])
    assert len(v.values) == 1
    assert v.devices == ("cpu:0",)
    assert v.values[0].device == "cpu:0"
    assert v.synchronization is SYNC.ON_WRITE
    out = strategy.run(lambda: v + 0)
    assert [t.tolist() for t in strategy.experimental_local_results(out)] == [
        [1.0, 2.0],
        [1.0, 2.0],
    ]


def test_central_storage_explicit_parameter_device():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="cpu:1")
    with strategy.scope():
        v = nd.Variable(1.0)
    assert v.devices == ("cpu:1",)
    assert v.values[0].device == "cpu:1"


def test_central_storage_replica_assign_mean_aggregates():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable([1.0, 2.0], aggregation=AGG.MEAN)
        strategy.run(lambda: v.assign(torch.tensor([1.0, 2.0]) * (replica_id() + 1)))
    assert components(v) == [[1.5, 3.0]]


def test_central_storage_replica_assign_add_sum_aggregates():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable(0.0, aggregation="sum")
        strategy.run(lambda: v.assign_add(float(replica_id() + 1)))
    assert components(v) == [3.0]


def test_central_storage_replica_assign_without_aggregation_raises():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable(0.0, name="c")
        with pytest.raises(ValueError, match=r"'c' has aggregation NONE.*Create it with"):
            strategy.run(lambda: v.assign(1.0))
    assert components(v) == [0.0]


def test_central_storage_sync_on_read_lives_on_the_compute_devices():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    v = sync_on_read(strategy, AGG.SUM)
    assert isinstance(v, nd.SyncOnReadVariable)
    assert v.devices == ("cpu:0", "cpu:1")
    assert v.value().tolist() == [3.0, 6.0]
