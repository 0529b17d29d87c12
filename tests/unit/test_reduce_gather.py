"""`reduce`, `gather`, `experimental_local_results` and distributed values from a function:
the examples of the reference pages, ported, plus API.md §3's rules (exact values)."""

import pytest
import torch

import nbdist as nd

TWO = ["cpu:0", "cpu:1"]
FOUR = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


@pytest.fixture(params=["mirrored", "central"])
def two(request):
    if request.param == "mirrored":
        return nd.MirroredStrategy(TWO)
    return nd.CentralStorageStrategy(TWO, parameter_device="cpu:0")


def test_reference_reduce_example_global_batch_of_8(two):
    # central-storage-strategy.txt: range(8) split [0,1,2,3] | [4,5,6,7].
    dataset = two.experimental_distribute_dataset([torch.arange(8)])
    with two.scope():
        for x in dataset:
            result = two.run(lambda v: v, args=(x,))
    assert two.reduce(nd.ReduceOp.SUM, result, axis=None).tolist() == [4, 6, 8, 10]
    assert two.reduce(nd.ReduceOp.SUM, result, axis=0).item() == 28


def test_partial_last_batch_of_6_needs_axis_and_uses_the_true_denominator(two):
    values = nd.PerReplica([torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])])
    assert two.reduce("mean", values, axis=0).item() == pytest.approx(2.5)  # 15 / 6
    assert two.reduce("sum", values, axis=0).item() == 15.0
    assert two.reduce("max", values, axis=0).item() == 5.0
    assert two.reduce("min", values, axis=0).item() == 0.0
    with pytest.raises(ValueError, match=r"different shapes.*replica 0: \(4,\).*replica 1: \(2,\)"):
        two.reduce("sum", values, axis=None)


def test_split_of_6_over_2_reduces_to_mean_of_6_values(two):
    dataset = two.experimental_distribute_dataset([torch.arange(6.0)])
    batch = next(iter(dataset))
    assert [t.tolist() for t in batch.values] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert two.reduce("mean", batch, axis=0).item() == pytest.approx(2.5)


def test_empty_replica_contributes_nothing():
    strategy = nd.MirroredStrategy(FOUR)
    value = nd.PerReplica(
        [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([5.0, 6.0]),
         torch.zeros(0)]
    )  # fmt: skip
    assert strategy.reduce("mean", value, axis=0).item() == pytest.approx(3.5)
    assert strategy.reduce("sum", value, axis=0).item() == 21.0
    assert strategy.reduce("max", value, axis=0).item() == 6.0


def test_integer_mean_is_floating(two):
    value = nd.PerReplica([torch.tensor([1, 2]), torch.tensor([4])])
    result = two.reduce("mean", value, axis=0)
    assert result.dtype == torch.float32 and result.item() == pytest.approx(7 / 3)
    across = two.reduce("mean", nd.PerReplica([torch.tensor(1), torch.tensor(2)]), axis=None)
    assert across.dtype == torch.float32 and across.item() == 1.5


def test_plain_values_count_as_the_same_on_every_replica(two):
    assert two.reduce("sum", torch.tensor([1.0, 2.0]), axis=0).item() == 6.0
    assert two.reduce("mean", torch.tensor([1.0, 2.0]), axis=0).item() == 1.5
    assert torch.equal(two.reduce("mean", torch.tensor([1.0, 2.0]), axis=None),
                       torch.tensor([1.0, 2.0]))  # fmt: skip
    with pytest.raises(ValueError, match=r"Cannot SUM a plain .* over 2 replicas.*PerReplica"):
        two.reduce("sum", torch.tensor(1.0), axis=None)


def test_one_replica_sum_of_plain_value_is_the_value():
    strategy = nd.OneDeviceStrategy("cpu")
    assert strategy.reduce("sum", torch.tensor(4.0), axis=None).item() == 4.0


def test_reduce_bad_inputs(two):
    value = nd.PerReplica([torch.tensor([1.0]), torch.tensor([2.0])])
    with pytest.raises(ValueError, match=r"axis 1 is out of range .* rank 1"):
        two.reduce("sum", value, axis=1)
    with pytest.raises(ValueError, match="Unknown reduce op 'avg'"):
        two.reduce("avg", value)
    scalars = nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(ValueError, match=r"scalars \(rank 0\)"):
        two.reduce("sum", scalars, axis=0)


def test_reduce_nested_structures(two):
    value = {"a": nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)]), "b": torch.tensor(5.0)}
    out = two.reduce("mean", value, axis=None)
    assert out["a"].item() == 1.5 and out["b"].item() == 5.0


def test_reference_gather_examples_three_axes():
    strategy = nd.MirroredStrategy(FOUR)
    single = torch.arange(6).reshape(1, 2, 3)
    values = strategy.experimental_distribute_values_from_function(lambda _: single.clone())
    assert strategy.gather(values, axis=0).shape == (4, 2, 3)
    assert torch.equal(strategy.gather(values, axis=0), single.repeat(4, 1, 1))
    axis1 = strategy.gather(values, axis=1)
    assert axis1.shape == (1, 8, 3) and axis1[0, 2].tolist() == [0, 1, 2]
    assert axis1[0, 3].tolist() == [3, 4, 5]
    axis2 = strategy.gather(values, axis=2)
    assert axis2.tolist() == [[[0, 1, 2] * 4, [3, 4, 5] * 4]]


def test_reference_gather_two_replicas_shape_2_1():
    strategy = nd.MirroredStrategy(TWO)
    values = strategy.experimental_distribute_values_from_function(
        lambda _: torch.tensor([[1], [2]])
    )
    assert strategy.gather(values, axis=0).tolist() == [[1], [2], [1], [2]]


def test_gather_bad_inputs():
    strategy = nd.MirroredStrategy(TWO)
    scalars = nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(ValueError, match=r"scalars \(rank 0\)"):
        strategy.gather(scalars, axis=0)
    vectors = nd.PerReplica([torch.ones(2), torch.ones(3)])
    assert strategy.gather(vectors, axis=0).shape == (5,)
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        strategy.gather(vectors, axis=1)


def test_distribute_values_from_function_reference_examples():
    strategy = nd.MirroredStrategy(TWO)
    constant = strategy.experimental_local_results(
        strategy.experimental_distribute_values_from_function(lambda ctx: torch.tensor(1.0))
    )
    assert [t.item() for t in constant] == [1.0, 1.0]
    array_value = [3.0, 2.0, 1.0]
    by_id = strategy.experimental_distribute_values_from_function(
        lambda ctx: array_value[ctx.replica_id_in_sync_group]
    )
    assert strategy.experimental_local_results(by_id) == (3.0, 2.0)
    counts = strategy.experimental_distribute_values_from_function(
        lambda ctx: ctx.num_replicas_in_sync
    )
    assert strategy.experimental_local_results(counts) == (2, 2)
    devices = strategy.extended.worker_devices
    placed = [torch.tensor(1.0, device=nd.core.devices.physical_device(d)) for d in devices]
    on_devices = strategy.experimental_distribute_values_from_function(
        lambda ctx: placed[ctx.replica_id_in_sync_group]
    )
    assert strategy.experimental_local_results(on_devices) == tuple(placed)


def test_local_results_of_plain_and_nested_values():
    strategy = nd.MirroredStrategy(TWO)
    assert strategy.experimental_local_results(torch.tensor(1.0)) == (torch.tensor(1.0),)
    nested = {"x": nd.PerReplica([1, 2]), "y": 3}
    assert strategy.experimental_local_results(nested) == ({"x": 1, "y": 3}, {"x": 2, "y": 3})
