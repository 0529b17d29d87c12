"""Variables' state_dict round trips, outside and inside strategy.run, for every kind of variable
(API.md §5, §11).
"""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.errors import CheckpointKeyError
from tests.unit.variables.helpers import AGG, components, mirrored, sync_on_read


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
