"""PerReplica and Mirrored values, ReduceOp and device strings (API.md §1, §2)."""

import pytest
import torch

import nbdist as nd
from nbdist.core.devices import canonical_device, canonical_devices, physical_device


def pr(*tensors):
    return nd.PerReplica([torch.as_tensor(t) for t in tensors])


def test_per_replica_values_and_repr():
    value = pr([0.0, 1.0], [2.0, 3.0])
    assert len(value.values) == 2 and torch.equal(value.values[1], torch.tensor([2.0, 3.0]))
    assert repr(value) == "PerReplica:{0: tensor([0., 1.]), 1: tensor([2., 3.])}"
    assert isinstance(value, nd.DistributedValues)


@pytest.mark.parametrize(
    "use",
    [
        lambda v: v + 1,
        lambda v: 1 + v,
        lambda v: v * v,
        lambda v: -v,
        lambda v: torch.add(v, 1),
        lambda v: torch.tensor(1.0) + v,
        lambda v: torch.stack([v]),
        lambda v: v.sum(),
        lambda v: float(v),
        lambda v: bool(v),
        lambda v: v[0],
    ],
)
def test_per_replica_used_as_a_tensor_is_a_type_error_naming_the_fix(use):
    with pytest.raises(TypeError, match=r"experimental_local_results.*reduce.*gather"):
        use(pr(1.0, 2.0))


def test_mirrored_reads_primary_in_cross_replica_context():
    mirrored = nd.Mirrored([torch.tensor(2.0), torch.tensor(2.0)])
    assert torch.equal(mirrored + 1, torch.tensor(3.0))
    assert torch.equal(torch.mul(mirrored, 3), torch.tensor(6.0))
    assert torch.equal(torch.tensor(1.0) + mirrored, torch.tensor(3.0))
    assert mirrored.primary is mirrored.values[0]


def test_mirrored_reads_local_component_in_replica_context():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    mirrored = nd.Mirrored([torch.tensor(1.0), torch.tensor(10.0)])
    result = strategy.run(lambda: mirrored * 1)
    assert [t.item() for t in result.values] == [1.0, 10.0]


def test_reduce_op_names_any_case():
    assert nd.ReduceOp.from_value("sum") is nd.ReduceOp.SUM
    assert nd.ReduceOp.from_value("Mean") is nd.ReduceOp.MEAN
    assert nd.ReduceOp.from_value(nd.ReduceOp.MAX) is nd.ReduceOp.MAX
    with pytest.raises(ValueError, match=r"Unknown reduce op 'avg'.*'SUM', 'MEAN', 'MAX', 'MIN'"):
        nd.ReduceOp.from_value("avg")


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("cpu", "cpu:0"),
        ("CPU:0", "cpu:0"),
        ("/cpu:0", "cpu:0"),
        ("/device:CPU:1", "cpu:1"),
        ("/job:worker/replica:0/task:1/device:CPU:0", "cpu:0"),
        (torch.device("cpu"), "cpu:0"),
    ],
)
def test_tensorflow_device_spellings_are_normalised(spelling, expected):
    assert canonical_device(spelling) == expected


@pytest.mark.parametrize("bad", ["tpu:0", "gpu:x", "cuda:0", "GPU:0", "/device:GPU:1"])
def test_unknown_or_missing_devices_name_what_exists(bad):
    if torch.cuda.device_count() > 1:
        pytest.skip("machine has GPUs")
    with pytest.raises(ValueError, match=rf"{bad!r}.*Devices on this machine: cpu:0, cpu:1"):
        canonical_device(bad)


def test_strategies_validate_devices_when_built():
    with pytest.raises(ValueError, match="'cuda:0' is not available"):
        nd.MirroredStrategy(["cpu:0", "cuda:0"])
    with pytest.raises(ValueError, match="name the same device twice"):
        canonical_devices(["cpu:0", "CPU:0"])
    with pytest.raises(ValueError, match="Unknown device 'tpu:0'"):
        nd.OneDeviceStrategy("tpu:0")


def test_logical_cpu_devices_compute_on_the_host():
    assert physical_device("cpu:1") == torch.device("cpu")


def test_select_replica_passes_plain_arguments_through_and_finds_nested_components():
    """Note [Calls per collective]: `run`'s arguments skip the walk when no top-level value is
    distributed or a container, and the walk still reaches components inside containers."""
    import collections

    from nbdist.core.values import select_replica

    model, optimizer = torch.nn.Linear(2, 2), object()
    args = (model, optimizer, torch.ones(1), 3)
    assert select_replica(1, args) is args  # nothing to select: the same tuple back
    pair = collections.namedtuple("pair", "a b")
    per_replica = nd.PerReplica([torch.tensor(0.0), torch.tensor(1.0)])
    for structure, pick in [
        ((model, per_replica), lambda out: out[1]),
        ((pair(model, per_replica),), lambda out: out[0].b),
        ([collections.OrderedDict(x=per_replica)], lambda out: out[0]["x"]),
        ({"batch": [per_replica]}, lambda out: out["batch"][0]),
    ]:
        out = select_replica(1, structure)
        assert pick(out).item() == 1.0, structure
