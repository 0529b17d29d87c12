"""strategy.extended: the variable-update recipe of TF's StrategyExtended page, ported
(reference/strategy-extended.txt), and the rest of API.md §3 StrategyExtended."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd

TWO = ("cpu:0", "cpu:1")


def replica_id() -> int:
    return nd.get_replica_context().replica_id_in_sync_group


def components(variable) -> list:
    return [c.value().tolist() for c in variable.values]


def strategies():
    return [
        pytest.param(lambda: nd.MirroredStrategy(list(TWO)), id="mirrored"),
        pytest.param(lambda: nd.CentralStorageStrategy(list(TWO)), id="central_storage"),
        pytest.param(lambda: nd.OneDeviceStrategy("cpu"), id="one_device"),
    ]


# -- the recipe: (update, variable) pairs -> merge_call -> batch_reduce_to -> update ------------
@pytest.mark.parametrize("make", strategies())
@pytest.mark.parametrize("reduce_op", [nd.ReduceOp.SUM, "SUM", "sum"])
def test_variable_update_recipe(make, reduce_op):
    strategy = make()
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        w = nd.Variable([1.0, 2.0], name="w")
        b = nd.Variable(10.0, name="b")
        steps = nd.Variable(0, dtype=torch.int64, name="steps")

        def merge_fn(s, pairs):
            assert s is strategy
            assert nd.in_cross_replica_context()
            assert nd.get_replica_context() is None
            reduced = s.extended.batch_reduce_to(reduce_op, pairs)
            assert len(reduced) == len(pairs)
            for (_, variable), total in zip(pairs, reduced):
                s.extended.update(variable, lambda var, t: var.assign_add(t), args=(total,))
            return "merged"

        def step():
            r = replica_id()
            pairs = [
                (torch.tensor([1.0, 2.0]) * (r + 1), w),  # sums to [3, 6] over two replicas
                (torch.tensor(float(r)), b),  # sums to 1
                (torch.tensor(1, dtype=torch.int64), steps),
            ]
            return nd.get_replica_context().merge_call(merge_fn, args=(pairs,))

        out = strategy.run(step)
    assert out == "merged"
    if n == 2:
        expected_w, expected_b = [4.0, 8.0], 11.0
    else:
        expected_w, expected_b = [2.0, 4.0], 10.0
    values = w.values if isinstance(w, nd.DistributedValues) else (w,)
    assert [v.value().tolist() for v in values] == [expected_w] * len(values)
    values = b.values if isinstance(b, nd.DistributedValues) else (b,)
    assert [v.value().item() for v in values] == [expected_b] * len(values)
    values = steps.values if isinstance(steps, nd.DistributedValues) else (steps,)
    assert [v.value().item() for v in values] == [n] * len(values)
    assert all(v.value().dtype == torch.int64 for v in values)


def test_variable_update_recipe_with_reduce_to_per_variable():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        w = nd.Variable([0.0, 0.0, 0.0])

        def merge_fn(s, grad, var):
            mean = s.extended.reduce_to("MEAN", grad, destinations=var)
            assert isinstance(mean, nd.Mirrored)
            assert mean.devices == var.devices
            s.extended.update(var, lambda v, t: v.assign_sub(t), args=(mean,))

        def step():
            grad = torch.tensor([1.0, 2.0, 3.0]) * (replica_id() + 1)
            nd.get_replica_context().merge_call(merge_fn, args=(grad, w))
            return w.read_value()

        out = strategy.run(step)
    assert components(w) == [[-1.5, -3.0, -4.5]] * 2
    assert [t.tolist() for t in out.values] == [[-1.5, -3.0, -4.5]] * 2


def test_reduce_to_with_a_variable_aggregation_is_refused_with_the_fix():
    # TF's page says reduce_to(VariableAggregation.SUM, t, v); TF's code asserts it is not
    # one, and nbdist takes a ReduceOp or its name, saying so.
    strategy = nd.MirroredStrategy(list(TWO))
    value = nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)], devices=TWO)
    with strategy.scope():
        with pytest.raises(ValueError, match=r"Unknown reduce op .*use nbdist\.ReduceOp or one"):
            strategy.extended.reduce_to(nd.VariableAggregation.SUM, value, "cpu:0")
        assert strategy.extended.reduce_to(nd.ReduceOp.SUM, value, "cpu:0").item() == 3.0


# -- reduce_to / batch_reduce_to ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "expected"), [("sum", [4.0, 6.0]), ("mean", [2.0, 3.0]), ("max", [3.0, 4.0])]
)
def test_reduce_to_destinations(op, expected):
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable([0.0, 0.0])
        value = strategy.run(lambda: torch.tensor([1.0, 2.0]) + 2.0 * replica_id())
        one = strategy.extended.reduce_to(op, value, "cpu:1")
        to_var = strategy.extended.reduce_to(op, value, var)
        to_list = strategy.extended.reduce_to(op, value, ["cpu:0", "cpu:1"])
    assert type(one) is torch.Tensor
    assert one.tolist() == expected
    for mirrored in (to_var, to_list):
        assert isinstance(mirrored, nd.Mirrored)
        assert mirrored.devices == TWO
        assert [t.tolist() for t in mirrored.values] == [expected, expected]


def test_reduce_to_central_storage_variable_is_one_tensor():
    strategy = nd.CentralStorageStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable([0.0, 0.0])
        value = strategy.run(lambda: torch.tensor([1.0, 2.0]) * (replica_id() + 1))
        reduced = strategy.extended.reduce_to("sum", value, var)
    assert type(reduced) is torch.Tensor
    assert reduced.tolist() == [3.0, 6.0]


def test_batch_reduce_to_returns_one_value_per_pair():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable(0.0)
        a = strategy.run(lambda: torch.tensor(float(replica_id() + 1)))
        b = strategy.run(lambda: torch.full((2, 2), replica_id(), dtype=torch.int32))
        out = strategy.extended.batch_reduce_to("sum", [(a, var), (b, "cpu:0"), (a, "cpu:1")])
    assert len(out) == 3
    assert isinstance(out[0], nd.Mirrored)
    assert [t.item() for t in out[0].values] == [3.0, 3.0]
    assert out[1].dtype == torch.int32
    assert out[1].tolist() == [[1, 1], [1, 1]]
    assert out[2].item() == 3.0


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda e: e.reduce_to("sum", torch.tensor(1.0), "cpu:0"), id="reduce_to"),
        pytest.param(
            lambda e: e.batch_reduce_to("sum", [(torch.tensor(1.0), "cpu:0")]),
            id="batch_reduce_to",
        ),
    ],
)
def test_reduce_to_in_replica_context_raises_with_a_fix(call):
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        with pytest.raises(
            RuntimeError,
            match=r"must be called in cross-replica context.*inside strategy\.run.*"
            r"merge_call.*all_reduce",
        ):
            strategy.run(lambda: call(strategy.extended))


def test_update_in_replica_context_raises_with_a_fix():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable(0.0)
        with pytest.raises(RuntimeError, match=r"extended\.update must be called in cross-replica"):
            strategy.run(lambda: strategy.extended.update(var, lambda v: v.assign_add(1.0)))
    assert components(var) == [0.0, 0.0]


# -- update ---------------------------------------------------------------------------------------
def test_update_group_true_returns_mirrored():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable([1.0, 2.0])
        seen = []

        def fn(component, delta, scale=1.0):
            seen.append(component)
            return component.assign_add(delta * scale)

        result = strategy.extended.update(
            var, fn, args=(torch.tensor([1.0, 1.0]),), kwargs={"scale": 2.0}
        )
    assert seen == list(var.values)
    assert isinstance(result, nd.Mirrored)
    assert result.values[0] is var.values[0]
    assert result.values[1] is var.values[1]
    assert components(var) == [[3.0, 4.0], [3.0, 4.0]]


def test_update_group_false_returns_a_tuple():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable([1.0, 2.0])
        result = strategy.extended.update(var, lambda v: v.read_value() * 2, group=False)
    assert isinstance(result, tuple)
    assert [t.tolist() for t in result] == [[2.0, 4.0], [2.0, 4.0]]


def test_update_unwraps_distributed_args_per_component():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable(0.0)
        # A PerReplica with the variable's locality: component k goes to component k.
        delta = nd.PerReplica([torch.tensor(1.0), torch.tensor(1.0)], devices=TWO)
        got = strategy.extended.update(var, lambda v, d: d, args=(delta,), group=False)
    assert got[0] is delta.values[0]
    assert got[1] is delta.values[1]


def test_update_of_a_plain_variable():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope():
        var = nd.Variable(1.0)
        grouped = strategy.extended.update(var, lambda v, d: v.assign_add(d), args=(2.0,))
        tupled = strategy.extended.update(var, lambda v: v.read_value(), group=False)
    assert grouped is var
    assert var.value().item() == 3.0
    assert isinstance(tupled, tuple)
    assert [t.item() for t in tupled] == [3.0]


def test_update_of_a_central_storage_variable():
    strategy = nd.CentralStorageStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable(1.0)
        result = strategy.extended.update(var, lambda v: v.assign_add(1.0))
    assert result is var.values[0]
    assert components(var) == [2.0]


# -- colocate_vars_with (the reference page's example) --------------------------------------------
def test_colocate_vars_with_example():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var1 = nd.Variable([1.0])
        with strategy.extended.colocate_vars_with(var1):
            var2 = nd.Variable([2.0])
            var3 = nd.Variable([3.0])
        assert var2.devices == var1.devices == TWO
        assert var3.devices == var1.devices
        calls = []

        def fn(v1, v2, v3):
            calls.append((v1, v2, v3))
            return v1.assign_add(v2 + v3)

        strategy.extended.update(var1, fn, args=(var2, var3))
    assert calls == [
        (var1.values[0], var2.values[0], var3.values[0]),
        (var1.values[1], var2.values[1], var3.values[1]),
    ]
    for v1, v2, v3 in calls:
        assert type(v1) is type(v2) is type(v3) is nd.Variable
        assert v1.device == v2.device == v3.device
    assert components(var1) == [[6.0], [6.0]]


def test_colocate_vars_with_on_central_storage_sync_on_read():
    strategy = nd.CentralStorageStrategy(list(TWO))
    with strategy.scope():
        metric = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        with strategy.extended.colocate_vars_with(metric):
            shadow = nd.Variable(5.0)
        got = strategy.extended.update(
            metric, lambda m, s: s.read_value(), args=(shadow,), group=False
        )
    assert shadow.devices == metric.devices == TWO
    assert [t.item() for t in got] == [5.0, 5.0]


# -- devices and properties -----------------------------------------------------------------------
def test_mirrored_devices():
    extended = nd.MirroredStrategy(["CPU:0", "/cpu:1"]).extended
    assert extended.worker_devices == TWO
    assert extended.parameter_devices == TWO
    assert extended.experimental_require_static_shapes is False


def test_central_storage_devices():
    extended = nd.CentralStorageStrategy(list(TWO)).extended
    assert extended.worker_devices == TWO
    assert extended.parameter_devices == ("cpu:0",)
    assert extended.experimental_require_static_shapes is False
    other = nd.CentralStorageStrategy(list(TWO), parameter_device="/cpu:1").extended
    assert other.parameter_devices == ("cpu:1",)
    single = nd.CentralStorageStrategy(["cpu:1"]).extended
    assert single.parameter_devices == ("cpu:1",)


def test_one_device_devices():
    extended = nd.OneDeviceStrategy("/cpu:0").extended
    assert extended.worker_devices == ("cpu:0",)
    assert extended.parameter_devices == ("cpu:0",)
    assert extended.experimental_require_static_shapes is False


def test_default_strategy_devices():
    extended = nd.get_strategy().extended
    assert extended.worker_devices == ("cpu:0",)
    assert extended.parameter_devices == ("cpu:0",)


def test_extended_is_one_object_per_strategy():
    strategy = nd.MirroredStrategy(list(TWO))
    assert strategy.extended is strategy.extended
    assert isinstance(strategy.extended, nd.StrategyExtended)


# -- broadcast_to ---------------------------------------------------------------------------------
def test_broadcast_to_devices_and_variables():
    strategy = nd.MirroredStrategy(list(TWO))
    tensor = torch.tensor([1.0, 2.0])
    with strategy.scope():
        var = nd.Variable([0.0, 0.0])
        to_var = strategy.extended.broadcast_to(tensor, var)
        to_list = strategy.extended.broadcast_to(tensor, list(TWO))
        one = strategy.extended.broadcast_to(tensor, "cpu:1")
    for mirrored in (to_var, to_list):
        assert isinstance(mirrored, nd.Mirrored)
        assert mirrored.devices == TWO
        assert [t.tolist() for t in mirrored.values] == [[1.0, 2.0], [1.0, 2.0]]
        assert mirrored.values[0].data_ptr() != mirrored.values[1].data_ptr()
    assert type(one) is torch.Tensor
    assert one.tolist() == [1.0, 2.0]


def test_broadcast_to_result_feeds_update():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        var = nd.Variable(0.0)
        value = strategy.extended.broadcast_to(torch.tensor(4.0), var)
        strategy.extended.update(var, lambda v, t: v.assign(t), args=(value,))
    assert components(var) == [4.0, 4.0]


def test_broadcast_to_on_one_device():
    strategy = nd.OneDeviceStrategy("cpu")
    with strategy.scope():
        out = strategy.extended.broadcast_to(torch.tensor([3.0]), "cpu:0")
    assert type(out) is torch.Tensor
    assert out.tolist() == [3.0]
