"""MirroredVariable: created in a MirroredStrategy scope, read and assigned in and out of replica
context, with every aggregation (API.md §5). Runs on two logical CPU devices.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nbdist as nd
from tests.unit.variables.helpers import AGG, SYNC, components, mirrored, replica_id


def test_mirrored_scope_gives_a_mirrored_variable():
    with mirrored().scope():
        v = nd.Variable([1.0, 2.0], name="w")
    assert isinstance(v, nd.MirroredVariable)
    assert isinstance(v, nd.Variable)
    assert len(v.values) == 2
    assert v.devices == ("cpu:0", "cpu:1")
    assert components(v) == [[1.0, 2.0], [1.0, 2.0]]
    assert v.values[0].value() is not v.values[1].value()  # two copies, not one aliased
    assert v.synchronization is SYNC.ON_WRITE
    assert v.aggregation is AGG.NONE
    assert v.trainable is True
    assert v.name == "w"
    assert v.device == "cpu:0"
    assert v.dtype == torch.float32
    assert v.shape == torch.Size([2])


def test_mirrored_explicit_on_write():
    with mirrored().scope():
        v = nd.Variable(1.0, synchronization=SYNC.ON_WRITE, trainable=False)
    assert isinstance(v, nd.MirroredVariable)
    assert v.synchronization is SYNC.ON_WRITE
    assert v.trainable is False


def test_mirrored_callable_initial_value_is_called_once():
    calls = []

    def init():
        calls.append(1)
        return torch.tensor([3.0])

    with mirrored().scope():
        v = nd.Variable(init)
    assert len(calls) == 1
    assert components(v) == [[3.0], [3.0]]


def test_synchronization_none_in_scope_raises():
    with mirrored().scope():
        with pytest.raises(
            ValueError, match=r"synchronization=NONE.*Use AUTO, ON_WRITE or ON_READ"
        ):
            nd.Variable(1.0, synchronization=SYNC.NONE)


def test_mirrored_cross_replica_reads_the_primary():
    with mirrored().scope():
        v = nd.Variable([1.0, 2.0])
        assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))
        assert torch.equal(v + 1, torch.tensor([2.0, 3.0]))
        assert torch.equal(torch.matmul(v, torch.ones(2)), torch.tensor(3.0))
    np.testing.assert_array_equal(v.numpy(), np.array([1.0, 2.0], dtype=np.float32))


def test_mirrored_cross_replica_assign_writes_every_component():
    with mirrored().scope():
        v = nd.Variable([1.0, 2.0])
        assert v.assign([5.0, 6.0]) is v
        assert components(v) == [[5.0, 6.0], [5.0, 6.0]]
        assert v.assign_add(torch.tensor([1.0, 2.0])) is v
        assert components(v) == [[6.0, 8.0], [6.0, 8.0]]
        assert v.assign_sub(1.0) is v
        assert components(v) == [[5.0, 7.0], [5.0, 7.0]]


def test_mirrored_cross_replica_assign_outside_scope():
    with mirrored().scope():
        v = nd.Variable(1.0)
    v.assign_add(2.0)
    assert components(v) == [3.0, 3.0]


def test_mirrored_cross_replica_assign_of_a_mirrored_value():
    with mirrored().scope():
        v = nd.Variable([0.0, 0.0])
        v.assign(nd.Mirrored([torch.tensor([7.0, 8.0]), torch.tensor([7.0, 8.0])]))
    assert components(v) == [[7.0, 8.0], [7.0, 8.0]]


def test_mirrored_cross_replica_assign_of_per_replica_raises():
    with mirrored().scope():
        v = nd.Variable([1.0, 2.0], aggregation=AGG.SUM)
        value = nd.PerReplica([torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0])])
        with pytest.raises(ValueError, match=r"PerReplica.*diverge.*Reduce the value first"):
            v.assign(value)
        with pytest.raises(ValueError, match=r"assign_add a PerReplica"):
            v.assign_add(value)
    assert components(v) == [[1.0, 2.0], [1.0, 2.0]]


def test_mirrored_replica_assign_without_aggregation_raises():
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable(1.0, name="w")
        with pytest.raises(
            ValueError, match=r"'w' has aggregation NONE.*aggregation=nd\.VariableAggregation"
        ):
            strategy.run(lambda: v.assign(2.0))
        with pytest.raises(ValueError, match=r"\[replica \d of 2\].*aggregation NONE"):
            strategy.run(lambda: v.assign_add(1.0))
    assert components(v) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [(AGG.SUM, [13.0, 23.0]), (AGG.MEAN, [11.5, 21.5]), (AGG.ONLY_FIRST_REPLICA, [11.0, 21.0])],
)
def test_mirrored_replica_assign_add_aggregates(aggregation, expected):
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable([10.0, 20.0], aggregation=aggregation)

        def step():
            v.assign_add(torch.tensor([1.0, 1.0]) * (replica_id() + 1))
            return v.read_value()

        out = strategy.run(step)
    assert components(v) == [expected, expected]
    # Every replica reads the aggregated value right after the write.
    assert [t.tolist() for t in out.values] == [expected, expected]


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [(AGG.SUM, 3.0), (AGG.MEAN, 1.5), (AGG.ONLY_FIRST_REPLICA, 1.0)],
)
def test_mirrored_replica_assign_aggregates(aggregation, expected):
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable(100.0, aggregation=aggregation)
        strategy.run(lambda: v.assign(float(replica_id() + 1)))
    assert components(v) == [expected, expected]


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [(AGG.SUM, 7.0), (AGG.MEAN, 8.5), (AGG.ONLY_FIRST_REPLICA, 9.0)],
)
def test_mirrored_replica_assign_sub_aggregates(aggregation, expected):
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable(10.0, aggregation=aggregation)
        strategy.run(lambda: v.assign_sub(float(replica_id() + 1)))
    assert components(v) == [expected, expected]


def test_mirrored_replica_assign_add_of_one_shared_tensor_sums_it_per_replica():
    strategy = mirrored()
    delta = torch.tensor(1.0)
    with strategy.scope():
        total = nd.Variable(0.0, aggregation="sum")
        mean = nd.Variable(0.0, aggregation="mean")

        def step():
            total.assign_add(delta)  # the identical object on both replicas
            mean.assign_add(delta)

        strategy.run(step)
    assert components(total) == [2.0, 2.0]
    assert components(mean) == [1.0, 1.0]


def test_mirrored_replica_read_is_the_local_component():
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable([1.0, 2.0])
    # Make the copies differ on purpose (through the components) to see which one is read.
    v.values[1].assign([3.0, 4.0])

    def read():
        r = replica_id()
        local = v.values[r].value()
        return (
            torch.equal(v.value(), local),
            v.read_value(),
            v + 0,
            torch.mul(v, 1),
        )

    same, value, plus, mul = strategy.run(read)
    assert same is True
    for out in (value, plus, mul):
        assert [t.tolist() for t in out.values] == [[1.0, 2.0], [3.0, 4.0]]
