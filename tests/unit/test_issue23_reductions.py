"""Issue 23: reductions that gave a wrong value with no error, in one process (the gloo path is
tests/dist/test_multi_worker_errors.py, the notebook's `cluster.strategy.reduce`
tests/cluster/one_cluster/test_runs.py).

- Bool tensors are refused by every reduction (Note [Bool reductions] in nbdist/core/reduce/op.py),
as
  TensorFlow refuses them, instead of a logical OR for SUM and 0.5 for a MEAN of `True`s.
- MAX/MIN along an axis where every replica's value is empty give TensorFlow's `reduce_max`/
  `reduce_min` of nothing (-inf/+inf, the lowest/highest integer), not zeros.
"""

import math

import pytest
import torch

import nbdist as nd

TWO = ["cpu:0", "cpu:1"]


def _flags():
    rid = nd.get_replica_context().replica_id_in_sync_group
    return torch.tensor([True, rid == 0])


def _strategies():
    return [
        nd.MirroredStrategy(TWO),
        nd.CentralStorageStrategy(TWO, parameter_device="cpu:0"),
        nd.OneDeviceStrategy("cpu"),
        nd.MirroredStrategy(["cpu:0"]),
    ]


@pytest.mark.parametrize("strategy", _strategies(), ids=repr)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [None, 0])
def test_strategy_reduce_refuses_bool_naming_the_conversion(strategy, op, axis):
    flags = strategy.run(_flags)
    with pytest.raises(nd.errors.ArgumentTypeError) as info:
        strategy.reduce(op, flags, axis=axis)
    message = str(info.value)
    assert f"Cannot reduce a bool tensor with {op.upper()}" in message
    assert "`t.int()` with SUM counts" in message and "`t.float()` with MEAN" in message
    # the conversions the message names give the counts and fractions
    counts = strategy.run(lambda: _flags().int())
    fractions = strategy.run(lambda: _flags().float())
    if strategy.num_replicas_in_sync == 2:
        assert strategy.reduce("sum", counts, axis=None).tolist() == [2, 1]
        assert strategy.reduce("mean", fractions, axis=None).tolist() == [1.0, 0.5]


@pytest.mark.parametrize("strategy", _strategies(), ids=repr)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_all_reduce_refuses_bool_on_every_replica(strategy, op):
    def step():
        return nd.get_replica_context().all_reduce(op, {"flags": _flags()})

    with pytest.raises(TypeError, match=f"Cannot reduce a bool tensor with {op.upper()}"):
        strategy.run(step)
    # nothing is left waiting: the next collective works
    ones = strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(1)))
    n = strategy.num_replicas_in_sync
    assert [t.item() for t in strategy.experimental_local_results(ones)] == [n] * n


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reduce_to_and_batch_reduce_to_refuse_bool(op):
    strategy = nd.MirroredStrategy(TWO)
    flags = strategy.run(_flags)
    with pytest.raises(TypeError, match="Cannot reduce a bool tensor"):
        strategy.extended.reduce_to(op, flags, "cpu:0")
    with pytest.raises(TypeError, match="Cannot reduce a bool tensor"):
        strategy.extended.batch_reduce_to(op, [(flags, "cpu:0")])
    with pytest.raises(TypeError, match="Cannot reduce a bool tensor"):
        nd.ReductionToOneDevice().reduce(op, flags, "cpu:0")


def test_integer_mean_is_floating_and_sum_stays_integer_on_every_path():
    strategy = nd.MirroredStrategy(TWO)
    ints = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor([1, 2]) * (ctx.replica_id_in_sync_group + 1)
    )
    mean = strategy.reduce("mean", ints, axis=None)
    assert mean.dtype == torch.float32 and mean.tolist() == [1.5, 3.0]
    total = strategy.reduce("sum", ints, axis=None)
    assert total.dtype == torch.int64 and total.tolist() == [3, 6]
    replicated = strategy.run(lambda x: nd.get_replica_context().all_reduce("mean", x), (ints,))
    for component in strategy.experimental_local_results(replicated):
        assert component.dtype == torch.float32 and component.tolist() == [1.5, 3.0]
    reduced = strategy.extended.reduce_to("mean", ints, "cpu:0")
    assert reduced.dtype == torch.float32 and reduced.tolist() == [1.5, 3.0]


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [
        (torch.float32, -math.inf, math.inf),
        (torch.float64, -math.inf, math.inf),
        (torch.int32, -(2**31), 2**31 - 1),
        (torch.int64, -(2**63), 2**63 - 1),
    ],
)
def test_max_min_along_an_axis_empty_on_every_replica_are_tfs_identities(dtype, low, high):
    strategy = nd.MirroredStrategy(TWO)
    empty = strategy.run(lambda: torch.zeros(0, 3, dtype=dtype))
    for op, expected in (("max", low), ("min", high)):
        result = strategy.reduce(op, empty, axis=0)
        assert result.dtype == dtype and result.tolist() == [expected] * 3, (op, result)
    # a plain (non-distributed) empty value too (it used to give None)
    plain = strategy.reduce("max", torch.zeros(0, 2, dtype=dtype), axis=0)
    assert plain.dtype == dtype and plain.tolist() == [low] * 2
    # SUM of nothing is 0 and MEAN of nothing is nan, as TensorFlow's reduce_sum/reduce_mean
    assert strategy.reduce("sum", empty, axis=0).tolist() == [0] * 3
    assert all(math.isnan(x) for x in strategy.reduce("mean", empty, axis=0).tolist())


def test_max_min_with_one_empty_replica_ignore_it():
    strategy = nd.MirroredStrategy(TWO)
    value = nd.PerReplica([torch.zeros(0, 2, dtype=torch.int32),
                           torch.tensor([[-5, 7]], dtype=torch.int32)])  # fmt: skip
    assert strategy.reduce("max", value, axis=0).tolist() == [-5, 7]
    assert strategy.reduce("min", value, axis=0).tolist() == [-5, 7]


# --- clear errors and TF's structure (issue 23, item 9) --------------------------------------


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("result", "shown"),
    [
        (lambda: None, "None (a NoneType)"),
        (lambda: {"loss": torch.tensor(1.0), "extra": None}, "None (a NoneType)"),
        (lambda: _Opaque(), "(a _Opaque)"),
    ],
)
def test_reduce_of_a_leaf_that_is_no_tensor_names_it_and_the_fix(result, shown):
    strategy = nd.MirroredStrategy(TWO)
    value = strategy.run(result)
    with pytest.raises(nd.errors.InvalidArgumentError) as info:
        strategy.reduce("sum", value, axis=None)
    message = str(info.value)
    assert "strategy.reduce cannot combine " in message and shown in message
    assert "strategy.reduce(op, result['loss'])" in message


def test_gather_of_a_none_component_names_it():
    strategy = nd.MirroredStrategy(TWO)
    with pytest.raises(ValueError, match=r"strategy.gather cannot combine None \(a NoneType\)"):
        strategy.gather(nd.PerReplica([torch.ones(1), None]), axis=0)


@pytest.mark.parametrize("strategy", [nd.MirroredStrategy(TWO), nd.OneDeviceStrategy("cpu")],
                         ids=repr)  # fmt: skip
def test_all_reduce_of_none_names_it(strategy):
    def step():
        return nd.get_replica_context().all_reduce("sum", [torch.ones(1), None])

    with pytest.raises(ValueError, match=r"all_reduce cannot combine None \(a NoneType\)"):
        strategy.run(step)


def test_distribute_values_from_function_returning_a_dict_gives_a_dict_of_per_replica():
    strategy = nd.MirroredStrategy(TWO)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: {"x": torch.tensor(float(ctx.replica_id_in_sync_group)), "n": 2}
    )
    assert type(value) is dict and sorted(value) == ["n", "x"]
    assert isinstance(value["x"], nd.PerReplica) and isinstance(value["n"], nd.PerReplica)
    assert strategy.experimental_local_results(value["n"]) == (2, 2)
    reduced = strategy.reduce("sum", value, axis=None)
    assert reduced["x"].item() == 1.0 and reduced["n"].item() == 4
    doubled = strategy.run(lambda v: v["x"] * 2, args=(value,))
    assert [t.item() for t in strategy.experimental_local_results(doubled)] == [0.0, 2.0]
    pairs = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, [torch.ones(1)])
    )
    assert type(pairs) is tuple and isinstance(pairs[0], nd.PerReplica)
    assert isinstance(pairs[1][0], nd.PerReplica)


@pytest.mark.parametrize("axis", [True, False])
def test_a_bool_axis_is_refused_not_taken_as_0_or_1(axis):
    strategy = nd.MirroredStrategy(TWO)
    value = strategy.run(lambda: torch.ones(2, 2))
    expected = rf"reduce needs an int axis or None, got {axis} \(a bool\)"
    with pytest.raises(TypeError, match=expected):
        strategy.reduce("sum", value, axis=axis)
    with pytest.raises(nd.errors.ArgumentTypeError, match=rf"gather needs an int axis, got {axis}"):
        strategy.gather(value, axis=axis)
    with pytest.raises(TypeError, match=rf"all_gather needs an int axis, got {axis}"):
        strategy.run(lambda: nd.get_replica_context().all_gather(torch.ones(2, 2), axis))


def test_per_replica_with_more_components_than_replicas_is_refused_by_run():
    strategy = nd.MirroredStrategy(TWO)
    three = nd.PerReplica([torch.tensor(0), torch.tensor(1), torch.tensor(2)])
    with pytest.raises(ValueError, match=r"PerReplica with 3 components .* 2 replica\(s\)"):
        strategy.run(lambda x: x, args=(three,))
    one_device = nd.OneDeviceStrategy("cpu")
    with pytest.raises(nd.errors.InvalidArgumentError, match="with 2 components"):
        one_device.run(lambda x: x, kwargs={"x": nd.PerReplica([1, 2])})
    # one component goes to every replica; as many as the replicas, one each
    assert strategy.experimental_local_results(
        strategy.run(lambda x: x + 1, args=(nd.PerReplica([5]),))) == (6,)
    assert strategy.experimental_local_results(
        strategy.run(lambda x: x + 1, args=(nd.PerReplica([5, 7]),))) == (6, 8)


def test_the_strategy_inside_a_parameter_server_function_reduces_by_the_same_rules():
    from nbdist.strategies.parameter_server.worker_task import WorkerStrategy

    strategy = WorkerStrategy()  # what `strategy` is inside a function run on a ps worker
    with pytest.raises(TypeError, match="Cannot reduce a bool tensor with SUM"):
        strategy.reduce("sum", torch.tensor([True, False]), axis=0)
    with pytest.raises(TypeError, match="Cannot reduce a bool tensor with MEAN"):
        strategy.reduce("mean", {"flags": torch.tensor([True])}, axis=None)
    with pytest.raises(TypeError, match=r"got True \(a bool\)"):
        strategy.reduce("sum", torch.ones(2, 2), axis=True)
    assert strategy.reduce("max", torch.zeros(0, 2), axis=0).tolist() == [-math.inf] * 2
    mean = strategy.reduce("mean", torch.tensor([1, 2]), axis=0)
    assert mean.dtype == torch.float32 and mean.item() == 1.5
    assert strategy.reduce("sum", {"loss": torch.tensor(3.0)}, axis=None)["loss"].item() == 3.0
