"""The current strategy and the replica, cross-replica and default contexts (API.md §3)."""

import pytest
import torch

import nbdist as nd

TWO = ["cpu:0", "cpu:1"]


def test_outside_every_scope_the_default_strategy_answers():
    strategy = nd.get_strategy()
    assert strategy.num_replicas_in_sync == 1
    assert not nd.has_strategy()
    assert not nd.in_cross_replica_context()
    ctx = nd.get_replica_context()
    assert ctx is not None and ctx.replica_id_in_sync_group == 0
    assert ctx.num_replicas_in_sync == 1
    assert strategy.reduce("mean", strategy.run(lambda: torch.tensor(3.0))) == 3.0
    assert torch.equal(ctx.all_reduce("sum", torch.tensor(2.0)), torch.tensor(2.0))


def test_scope_enters_cross_replica_context():
    strategy = nd.MirroredStrategy(TWO)
    with strategy.scope():
        assert nd.get_strategy() is strategy
        assert nd.has_strategy()
        assert nd.in_cross_replica_context()
        assert nd.get_replica_context() is None
    assert nd.get_strategy() is not strategy
    assert not nd.has_strategy()


def test_replica_context_inside_run():
    strategy = nd.MirroredStrategy(TWO)

    def fn():
        ctx = nd.get_replica_context()
        assert nd.get_strategy() is strategy and nd.has_strategy()
        assert not nd.in_cross_replica_context()
        return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, ctx.devices

    ids, counts, devices = strategy.run(fn)
    assert ids.values == (0, 1)
    assert counts == 2
    assert devices[0].values == ("cpu:0", "cpu:1")


def test_merge_fn_runs_in_cross_replica_context():
    strategy = nd.MirroredStrategy(TWO)
    seen = []

    def merge_fn(s, value):
        seen.append((s is strategy, nd.in_cross_replica_context(), nd.get_replica_context()))
        return value

    strategy.run(lambda: nd.get_replica_context().merge_call(merge_fn, args=(1,)))
    assert seen == [(True, True, None)]


def test_reentering_the_same_strategy_nests():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope(), strategy.scope():
        assert nd.get_strategy() is strategy
    assert not nd.has_strategy()


def test_a_second_strategy_scope_inside_the_first_raises():
    first, second = nd.MirroredStrategy(TWO), nd.OneDeviceStrategy("cpu")
    with first.scope():
        with pytest.raises(RuntimeError, match=r"Mixing different nbdist\.Strategy objects"):
            with second.scope():
                pass
        with pytest.raises(RuntimeError, match=r"Mixing different nbdist\.Strategy objects"):
            second.run(lambda: None)
        assert nd.get_strategy() is first


def test_experimental_set_strategy():
    strategy = nd.MirroredStrategy(TWO)
    nd.experimental_set_strategy(strategy)
    try:
        assert nd.get_strategy() is strategy and nd.has_strategy()
        assert nd.in_cross_replica_context()
    finally:
        nd.experimental_set_strategy(None)
    assert not nd.has_strategy()
    with pytest.raises(TypeError, match="takes a Strategy or None"):
        nd.experimental_set_strategy("mirrored")


def test_loss_reduction_defaults_to_mean():
    assert nd.get_loss_reduction() is nd.ReduceOp.MEAN


def test_run_inside_run_is_refused():
    strategy = nd.MirroredStrategy(TWO)
    with pytest.raises(RuntimeError, match=r"strategy\.run was called inside strategy\.run"):
        strategy.run(lambda: strategy.run(lambda: None))


def test_scope_sets_default_device_and_run_places_on_replica_device():
    strategy = nd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.device.type == "cpu"
    assert strategy.extended.worker_devices == ("cpu:0",)


def test_single_worker_strategies_should_checkpoint():
    for strategy in (nd.MirroredStrategy(TWO), nd.OneDeviceStrategy("cpu"), nd.get_strategy()):
        assert strategy.extended.should_checkpoint
        assert strategy.extended.should_save_summary
        assert strategy.extended.should_init
