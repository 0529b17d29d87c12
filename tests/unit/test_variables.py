"""nd.Variable, MirroredVariable and SyncOnReadVariable (API.md §5, §11).

Every multi-replica case runs on two logical CPU devices, so it needs no GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nbdist as nd
from nbdist.errors import CheckpointKeyError

AGG = nd.VariableAggregation
SYNC = nd.VariableSynchronization


def mirrored() -> nd.MirroredStrategy:
    return nd.MirroredStrategy(["cpu:0", "cpu:1"])


def replica_id() -> int:
    return nd.get_replica_context().replica_id_in_sync_group


def components(variable) -> list[list[float]]:
    return [c.value().tolist() for c in variable.values]


# -- plain variables, outside any scope ---------------------------------------------------------
def test_plain_variable_attributes():
    v = nd.Variable([1.0, 2.0], name="w")
    assert type(v) is nd.Variable
    assert not isinstance(v, nd.DistributedValues)
    assert v.device == "cpu:0"
    assert v.dtype == torch.float32
    assert v.shape == torch.Size([2])
    assert v.name == "w"
    assert v.trainable is True
    assert v.synchronization is SYNC.AUTO
    assert v.aggregation is AGG.NONE
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))
    assert torch.equal(v.read_value(), torch.tensor([1.0, 2.0]))
    array = v.numpy()
    assert isinstance(array, np.ndarray)
    np.testing.assert_array_equal(array, np.array([1.0, 2.0], dtype=np.float32))


def test_plain_variable_default_name_and_dtypes():
    assert nd.Variable(1.0).name == "Variable"
    assert nd.Variable(1.5).dtype == torch.float32  # Python floats take torch's default dtype
    assert nd.Variable(3, dtype=torch.int64).dtype == torch.int64
    assert nd.Variable(torch.zeros(2, 3, dtype=torch.float64)).dtype == torch.float64
    assert nd.Variable(torch.zeros(2, 3)).shape == torch.Size([2, 3])
    assert torch.equal(nd.Variable(lambda: torch.ones(2)).value(), torch.ones(2))


def test_plain_variable_copies_its_initial_value():
    source = torch.tensor([1.0, 2.0])
    v = nd.Variable(source)
    source.add_(10.0)
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))


def test_read_value_is_a_snapshot():
    v = nd.Variable([1.0, 2.0])
    snapshot = v.read_value()
    snapshot.add_(100.0)
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))
    v.assign([5.0, 6.0])
    assert torch.equal(snapshot, torch.tensor([101.0, 102.0]))


def test_assign_methods_return_the_variable_and_write():
    v = nd.Variable([1.0, 2.0])
    assert v.assign([3.0, 4.0]) is v
    assert torch.equal(v.value(), torch.tensor([3.0, 4.0]))
    assert v.assign_add(torch.tensor([1.0, 1.0])) is v
    assert torch.equal(v.value(), torch.tensor([4.0, 5.0]))
    assert v.assign_sub(0.5) is v
    assert torch.equal(v.value(), torch.tensor([3.5, 4.5]))


def test_assign_keeps_the_variable_dtype():
    v = nd.Variable([1, 2], dtype=torch.int64)
    v.assign_add(torch.tensor([1, 1], dtype=torch.int32))
    assert v.dtype == torch.int64
    assert torch.equal(v.value(), torch.tensor([2, 3]))


def test_variable_works_in_torch_operations():
    v = nd.Variable([1.0, 2.0])
    left = v + 1
    assert type(left) is torch.Tensor
    assert torch.equal(left, torch.tensor([2.0, 3.0]))
    right = torch.tensor(1.0) + v
    assert type(right) is torch.Tensor
    assert torch.equal(right, torch.tensor([2.0, 3.0]))
    assert torch.equal(torch.matmul(v, torch.tensor([3.0, 4.0])), torch.tensor(11.0))
    assert torch.equal(v @ torch.tensor([3.0, 4.0]), torch.tensor(11.0))
    assert torch.equal(torch.tensor([3.0, 4.0]) @ v, torch.tensor(11.0))
    assert torch.equal(torch.add(v, v), torch.tensor([2.0, 4.0]))
    assert torch.equal(v * v, torch.tensor([1.0, 4.0]))
    assert torch.equal(2 - v, torch.tensor([1.0, 0.0]))
    assert torch.equal(-v, torch.tensor([-1.0, -2.0]))
    assert torch.equal(v[1], torch.tensor(2.0))
    assert torch.equal(torch.nn.functional.relu(v - 1.5), torch.tensor([0.0, 0.5]))
    assert torch.equal(v > 1.5, torch.tensor([False, True]))
    assert float(nd.Variable(2.5)) == 2.5


def test_unknown_synchronization_name():
    with pytest.raises(ValueError, match=r"Unknown synchronization 'bogus'.*ON_READ"):
        nd.Variable(1.0, synchronization="bogus")


def test_unknown_aggregation_name():
    with pytest.raises(ValueError, match=r"Unknown aggregation 'median'.*ONLY_FIRST_REPLICA"):
        nd.Variable(1.0, aggregation="median")


def test_enum_names_are_accepted():
    v = nd.Variable(1.0, synchronization="on_read", aggregation="sum")
    assert v.synchronization is SYNC.ON_READ
    assert v.aggregation is AGG.SUM
    assert v.trainable is False


# -- one-device and default scopes --------------------------------------------------------------
def test_one_device_scope_gives_a_plain_variable():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope():
        v = nd.Variable([1.0, 2.0], aggregation=AGG.SUM)
    assert type(v) is nd.Variable
    assert v.device == "cpu:0"
    assert v.aggregation is AGG.SUM
    assert v.synchronization is SYNC.AUTO
    out = strategy.run(lambda: v.assign_add([1.0, 1.0]) + 0)
    assert torch.equal(out, torch.tensor([2.0, 3.0]))


def test_default_strategy_scope_gives_a_plain_variable():
    with nd.get_strategy().scope():
        v = nd.Variable(1.0)
    assert type(v) is nd.Variable


# -- mirrored variables -------------------------------------------------------------------------
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


# -- sync-on-read variables ---------------------------------------------------------------------
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


def sync_on_read(strategy, aggregation):
    """A SyncOnRead variable whose components are [1, 2] and [2, 4] (written in replica context)."""
    with strategy.scope():
        v = nd.Variable([0.0, 0.0], synchronization="ON_READ", aggregation=aggregation)
    strategy.run(lambda: v.assign(torch.tensor([1.0, 2.0]) * (replica_id() + 1)))
    return v


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


# -- checkpoints --------------------------------------------------------------------------------
def test_plain_state_dict_round_trip():
    v = nd.Variable([1.0, 2.0])
    state = v.state_dict()
    assert list(state) == ["value"]
    assert torch.equal(state["value"], torch.tensor([1.0, 2.0]))
    v.assign([9.0, 9.0])
    assert torch.equal(state["value"], torch.tensor([1.0, 2.0]))  # the checkpoint is a copy
    assert v.load_state_dict(state) is None
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))


def test_load_state_dict_needs_the_value_key():
    v = nd.Variable(1.0)
    with pytest.raises(CheckpointKeyError, match=r"one key, 'value'; got \['weights'\]") as e:
        v.load_state_dict({"weights": torch.tensor(2.0)})
    assert isinstance(e.value, KeyError) and "state_dict()" in str(e.value)


def test_mirrored_state_dict_round_trip_cross_replica():
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable([1.0, 2.0])
        fresh = nd.Variable([0.0, 0.0])
        state = v.state_dict()
        fresh.load_state_dict(state)
    assert torch.equal(state["value"], torch.tensor([1.0, 2.0]))
    assert components(fresh) == [[1.0, 2.0], [1.0, 2.0]]


def test_sync_on_read_state_dict_round_trip_cross_replica():
    strategy = mirrored()
    v = sync_on_read(strategy, AGG.SUM)
    with strategy.scope():
        state = v.state_dict()
        fresh = nd.Variable([0.0, 0.0], synchronization="ON_READ", aggregation="SUM")
        fresh.load_state_dict(state)
    assert state["value"].tolist() == [3.0, 6.0]
    assert components(fresh) == [[1.5, 3.0], [1.5, 3.0]]
    assert fresh.value().tolist() == [3.0, 6.0]


def test_plain_state_dict_inside_run():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope():
        v = nd.Variable([1.0, 2.0])
        state = strategy.run(lambda: v.state_dict())
        v.assign([0.0, 0.0])
        strategy.run(lambda: v.load_state_dict(state))
    assert torch.equal(v.value(), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("aggregation", [AGG.NONE, AGG.SUM, AGG.MEAN, AGG.ONLY_FIRST_REPLICA])
def test_mirrored_state_dict_round_trip_inside_run(aggregation):
    strategy = mirrored()
    with strategy.scope():
        v = nd.Variable([1.0, 2.0], aggregation=aggregation)
        fresh = nd.Variable([0.0, 0.0], aggregation=aggregation)
        state = strategy.run(lambda: v.state_dict())
        # Saving from every replica at once gives one consistent checkpoint.
        saved = [s["value"].tolist() for s in strategy.experimental_local_results(state)]
        assert saved == [[1.0, 2.0], [1.0, 2.0]]
        strategy.run(lambda s: fresh.load_state_dict(s), args=(state,))
    assert components(fresh) == [[1.0, 2.0], [1.0, 2.0]]


@pytest.mark.parametrize(
    ("aggregation", "saved"),
    [
        (AGG.SUM, [3.0, 6.0]),
        (AGG.MEAN, [1.5, 3.0]),
        (AGG.ONLY_FIRST_REPLICA, [1.0, 2.0]),
    ],
)
def test_sync_on_read_state_dict_round_trip_inside_run(aggregation, saved):
    strategy = mirrored()
    v = sync_on_read(strategy, aggregation)
    with strategy.scope():
        fresh = nd.Variable([0.0, 0.0], synchronization="ON_READ", aggregation=aggregation)
        state = strategy.run(lambda: v.state_dict())
        # Every replica saves the aggregated (cross-replica) value.
        got = [s["value"].tolist() for s in strategy.experimental_local_results(state)]
        assert got == [saved, saved]
        strategy.run(lambda s: fresh.load_state_dict(s), args=(state,))
        assert fresh.value().tolist() == saved
        assert fresh.state_dict()["value"].tolist() == saved


def test_central_storage_state_dict_round_trip_inside_run():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = nd.Variable([1.0, 2.0])
        fresh = nd.Variable([0.0, 0.0])
        state = strategy.run(lambda: v.state_dict())
        saved = [s["value"].tolist() for s in strategy.experimental_local_results(state)]
        assert saved == [[1.0, 2.0], [1.0, 2.0]]
        strategy.run(lambda s: fresh.load_state_dict(s), args=(state,))
    assert components(fresh) == [[1.0, 2.0]]


# -- central storage ----------------------------------------------------------------------------
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


# -- colocation ---------------------------------------------------------------------------------
def test_colocate_vars_with_mirrored():
    strategy = mirrored()
    with strategy.scope():
        first = nd.Variable(1.0)
        with strategy.extended.colocate_vars_with(first):
            second = nd.Variable(2.0)
            third = nd.Variable(3.0, synchronization="ON_READ", aggregation="SUM")
    assert second.devices == first.devices == ("cpu:0", "cpu:1")
    assert third.devices == first.devices
    assert components(second) == [2.0, 2.0]


def test_colocate_vars_with_central_storage_uses_the_variable_devices():
    strategy = nd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="cpu:1")
    with strategy.scope():
        central = nd.Variable(1.0)
        per_device = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        with strategy.extended.colocate_vars_with(per_device):
            spread = nd.Variable(2.0)
        with strategy.extended.colocate_vars_with(central):
            gathered = nd.Variable(3.0, synchronization="ON_READ", aggregation="SUM")
        after = nd.Variable(4.0)
    assert spread.devices == ("cpu:0", "cpu:1")
    assert components(spread) == [2.0, 2.0]
    assert gathered.devices == ("cpu:1",)
    assert after.devices == ("cpu:1",)  # colocation ends with the block


def test_colocate_vars_with_a_tensor_raises():
    strategy = mirrored()
    with strategy.scope():
        with pytest.raises(ValueError, match=r"colocate_vars_with needs a variable created in"):
            with strategy.extended.colocate_vars_with(torch.tensor(1.0)):
                pass


def test_assign_needs_equal_shapes_and_deltas_must_broadcast():
    v = nd.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match=r"assign a value of shape \(\) to a variable of shape"):
        v.assign(5.0)
    with pytest.raises(ValueError, match=r"shape \(3,\) to a variable of shape \(2,\)"):
        v.assign([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"assign_add a value of shape \(3,\)"):
        v.assign_add([1.0, 2.0, 3.0])
    assert v.assign_add(1.0).numpy().tolist() == [2.0, 3.0]


STRATEGIES_FOR_ARGUMENTS = {
    "none": None,
    "one_device": lambda: nd.OneDeviceStrategy("cpu:0"),
    "mirrored": lambda: nd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "multi_worker_single": lambda: nd.MultiWorkerMirroredStrategy(),
}


def _in_scope(make):
    import contextlib

    return make().scope() if make is not None else contextlib.nullcontext()


@pytest.mark.parametrize(
    "make", STRATEGIES_FOR_ARGUMENTS.values(), ids=STRATEGIES_FOR_ARGUMENTS.keys()
)
@pytest.mark.parametrize(
    ("argument", "value"),
    [("constraint", abs), ("shape", (3,)), ("caching_device", "cpu:0"),
     ("validate_shape", False), ("import_scope", "x")],
)  # fmt: skip
def test_tensorflow_variable_arguments_nbdist_lacks_are_refused_by_name(make, argument, value):
    with _in_scope(make):
        with pytest.raises(nd.errors.UnsupportedOptionError, match=f"{argument}=") as info:
            nd.Variable(torch.zeros(3), **{argument: value})
    assert isinstance(info.value, ValueError) and "Remove" in str(info.value)


@pytest.mark.parametrize(
    "make", STRATEGIES_FOR_ARGUMENTS.values(), ids=STRATEGIES_FOR_ARGUMENTS.keys()
)
def test_a_misspelt_variable_argument_is_named_not_swallowed(make):
    with _in_scope(make):
        with pytest.raises(nd.errors.UnknownArgumentError, match=r"'trainabel'.*accepts") as info:
            nd.Variable(torch.zeros(3), trainabel=False)
        assert isinstance(info.value, TypeError)
        # TensorFlow's defaults change nothing and are accepted.
        v = nd.Variable(torch.zeros(3), validate_shape=True, shape=None, constraint=None)
        assert v.shape == (3,)


def test_device_inside_a_strategy_scope_is_refused_not_ignored():
    with nd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        with pytest.raises(nd.errors.UnsupportedOptionError, match="colocate_vars_with"):
            nd.Variable(1.0, device="cpu:1")
    assert nd.Variable(1.0, device="cpu:0").device == "cpu:0"
