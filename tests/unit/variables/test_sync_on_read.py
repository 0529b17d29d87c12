"""SyncOnReadVariable: local writes in replica context, aggregated reads across replicas (API.md
§5). Runs on two logical CPU devices.
"""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from tests.unit.variables.helpers import AGG, SYNC, components, mirrored, replica_id, sync_on_read


def test_on_read_gives_a_sync_on_read_variable():
    with mirrored().scope():
        v = nd.Variable([0.0, 0.0], synchronization=SYNC.ON_READ, aggregation=AGG.SUM)
        trained = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM", trainable=True)
    assert isinstance(v, nd.SyncOnReadVariable)
    assert not isinstance(v, nd.MirroredVariable)
    assert isinstance(v, nd.Variable)
    assert v.synchronization is SYNC.ON_READ
    assert v.aggregation is AGG.SUM
    assert v.trainable is False
    assert trained.trainable is True
    assert v.devices == ("cpu:0", "cpu:1")
    assert components(v) == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("aggregation", [AGG.SUM, AGG.MEAN, AGG.ONLY_FIRST_REPLICA, AGG.NONE])
def test_sync_on_read_replica_assign_touches_only_the_local_component(aggregation):
    strategy = mirrored()
    v = sync_on_read(strategy, aggregation)
    assert components(v) == [[1.0, 2.0], [2.0, 4.0]]
    before = len(strategy.extended.telemetry)
    out = strategy.run(lambda: v.assign_add(torch.tensor([10.0, 10.0])).read_value())
    assert components(v) == [[11.0, 12.0], [12.0, 14.0]]
    assert [t.tolist() for t in out.values] == [[11.0, 12.0], [12.0, 14.0]]
    strategy.run(lambda: v.assign_sub(float(replica_id())))
    assert components(v) == [[11.0, 12.0], [11.0, 13.0]]
    assert len(strategy.extended.telemetry) == before  # no communication


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [(AGG.SUM, [3.0, 6.0]), (AGG.MEAN, [1.5, 3.0]), (AGG.ONLY_FIRST_REPLICA, [1.0, 2.0])],
)
def test_sync_on_read_cross_replica_read_aggregates(aggregation, expected):
    strategy = mirrored()
    v = sync_on_read(strategy, aggregation)
    assert v.value().tolist() == expected
    assert v.read_value().tolist() == expected
    assert v.numpy().tolist() == expected
    assert (v + 0).tolist() == expected
    with strategy.scope():
        assert v.value().tolist() == expected
    # Reading does not change the components.
    assert components(v) == [[1.0, 2.0], [2.0, 4.0]]


def test_sync_on_read_replica_read_is_the_local_component():
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.SUM)
    out = strategy.run(lambda: (v.read_value(), v * 1))
    assert [t.tolist() for t in out[0].values] == [[1.0, 2.0], [2.0, 4.0]]
    assert [t.tolist() for t in out[1].values] == [[1.0, 2.0], [2.0, 4.0]]


def test_sync_on_read_without_aggregation_has_no_cross_replica_value():
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.NONE)
    with pytest.raises(ValueError, match=r"aggregation NONE.*Read it inside strategy\.run"):
        v.value()
    with pytest.raises(ValueError, match=r"aggregation NONE"):
        v.numpy()


@pytest.mark.parametrize(
    ("aggregation", "component"),
    [(AGG.SUM, [2.0, 3.0]), (AGG.MEAN, [4.0, 6.0]), (AGG.ONLY_FIRST_REPLICA, [4.0, 6.0])],
)
def test_sync_on_read_cross_replica_assign_restores(aggregation, component):
    strategy = mirrored()
    v = sync_on_read(strategy, aggregation)
    with strategy.scope():
        assert v.assign(torch.tensor([4.0, 6.0])) is v
    assert components(v) == [component, component]
    assert v.value().tolist() == [4.0, 6.0]


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_sync_on_read_sum_cross_replica_increment_raises(method):
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.SUM)
    with strategy.scope():
        with pytest.raises(
            ValueError, match=rf"aggregation SUM does not support {method} in cross-replica"
        ):
            getattr(v, method)(1.0)
    assert components(v) == [[1.0, 2.0], [2.0, 4.0]]


def test_sync_on_read_mean_cross_replica_assign_add_adds_to_each_component():
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.MEAN)
    v.assign_add(torch.tensor([1.0, 1.0]))
    assert components(v) == [[2.0, 3.0], [3.0, 5.0]]
    assert v.value().tolist() == [2.5, 4.0]


def test_sync_on_read_cross_replica_assign_of_per_replica_raises():
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.MEAN)
    with pytest.raises(ValueError, match=r"PerReplica.*assign inside strategy\.run"):
        v.assign(nd.PerReplica([torch.zeros(2), torch.ones(2)]))
    assert components(v) == [[1.0, 2.0], [2.0, 4.0]]
