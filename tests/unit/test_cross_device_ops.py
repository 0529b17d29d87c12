"""CrossDeviceOps, CommunicationOptions and telemetry (API.md §7, §2, §11)."""

from __future__ import annotations

import pytest
import torch

import nbdist as nd
from nbdist.telemetry.records import CollectiveRecord, Telemetry

OPS = [nd.ReductionToOneDevice, nd.HierarchicalCopyAllReduce]
TWO = ("cpu:0", "cpu:1")


def per_replica(a, b) -> nd.PerReplica:
    return nd.PerReplica([torch.tensor(a), torch.tensor(b)], devices=TWO)


def replica_id() -> int:
    return nd.get_replica_context().replica_id_in_sync_group


# -- reduce -------------------------------------------------------------------------------------
@pytest.mark.parametrize("ops_class", OPS)
@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (nd.ReduceOp.SUM, [4.0, 7.0]),
        (nd.ReduceOp.MEAN, [2.0, 3.5]),
        (nd.ReduceOp.MAX, [3.0, 5.0]),
        (nd.ReduceOp.MIN, [1.0, 2.0]),
        ("sum", [4.0, 7.0]),
        ("Mean", [2.0, 3.5]),
        ("MAX", [3.0, 5.0]),
        ("min", [1.0, 2.0]),
    ],
)
def test_reduce_to_one_device(ops_class, op, expected):
    value = per_replica([1.0, 5.0], [3.0, 2.0])
    result = ops_class().reduce(op, value, destinations="cpu:0")
    assert type(result) is torch.Tensor
    assert result.tolist() == expected
    # The inputs are untouched.
    assert [v.tolist() for v in value.values] == [[1.0, 5.0], [3.0, 2.0]]


@pytest.mark.parametrize("ops_class", OPS)
@pytest.mark.parametrize(
    ("op", "expected"),
    [("SUM", [4.0, 7.0]), ("MEAN", [2.0, 3.5]), ("MAX", [3.0, 5.0]), ("MIN", [1.0, 2.0])],
)
def test_reduce_to_two_devices_gives_mirrored(ops_class, op, expected):
    value = per_replica([1.0, 5.0], [3.0, 2.0])
    result = ops_class().reduce(op, value, destinations=list(TWO))
    assert isinstance(result, nd.Mirrored)
    assert result.devices == TWO
    assert [v.tolist() for v in result.values] == [expected, expected]
    assert result.values[0] is not result.values[1]
    assert result.values[0].data_ptr() != result.values[1].data_ptr()


@pytest.mark.parametrize("ops_class", OPS)
def test_reduce_destinations_spelled_as_tf_devices_or_a_value(ops_class):
    value = per_replica([1.0], [2.0])
    ops = ops_class()
    assert ops.reduce("sum", value, destinations="/CPU:0").tolist() == [3.0]
    mirrored = ops.reduce("sum", value, destinations=["CPU:0", "/device:CPU:1"])
    assert mirrored.devices == TWO
    # A distributed value as destination: its devices.
    again = ops.reduce("sum", value, destinations=mirrored)
    assert isinstance(again, nd.Mirrored)
    assert again.devices == TWO
    assert [v.tolist() for v in again.values] == [[3.0], [3.0]]


def test_reduce_mean_of_integers_is_floating():
    result = nd.ReductionToOneDevice().reduce(
        "mean", nd.PerReplica([torch.tensor([1, 2]), torch.tensor([2, 5])]), "cpu:0"
    )
    assert result.is_floating_point()
    assert result.tolist() == [1.5, 3.5]


def test_reduce_sum_of_integers_keeps_the_dtype():
    result = nd.ReductionToOneDevice().reduce(
        "sum", nd.PerReplica([torch.tensor([1, 2]), torch.tensor([2, 5])]), "cpu:0"
    )
    assert result.dtype == torch.int64
    assert result.tolist() == [3, 7]


def test_reduction_to_one_device_accumulation_fn():
    calls = []

    def accumulate(tensors):
        calls.append(len(tensors))
        return torch.stack(tensors).sum(dim=0)

    ops = nd.ReductionToOneDevice(reduce_to_device="CPU:1", accumulation_fn=accumulate)
    assert ops.reduce_to_device == "cpu:1"
    value = per_replica([1.0, 5.0], [3.0, 2.0])
    assert ops.reduce("sum", value, "cpu:0").tolist() == [4.0, 7.0]
    assert ops.reduce("mean", value, "cpu:0").tolist() == [2.0, 3.5]
    assert calls == [2, 2]


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_num_packs_must_be_positive(bad):
    with pytest.raises(ValueError, match=r"num_packs must be a positive whole number"):
        nd.HierarchicalCopyAllReduce(num_packs=bad)
    with pytest.raises(ValueError, match=r"num_packs must be a positive whole number"):
        nd.NcclAllReduce(num_packs=bad)


# -- batch_reduce -------------------------------------------------------------------------------
@pytest.mark.parametrize("ops_class", OPS)
def test_batch_reduce_values_of_different_shapes_and_dtypes(ops_class):
    pairs = [
        (per_replica([1.0, 5.0], [3.0, 2.0]), "cpu:0"),
        (
            nd.PerReplica(
                [torch.ones(2, 2, dtype=torch.int64), 2 * torch.ones(2, 2, dtype=torch.int64)]
            ),
            list(TWO),
        ),
        (per_replica(1.0, 2.0), "cpu:1"),
        (nd.PerReplica([torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)]), list(TWO)),
        (nd.PerReplica([torch.tensor([1.5], dtype=torch.float64)] * 2), "cpu:0"),
    ]
    out = ops_class().batch_reduce("sum", pairs)
    assert isinstance(out, list)
    assert len(out) == 5
    assert type(out[0]) is torch.Tensor
    assert out[0].tolist() == [4.0, 7.0]
    assert isinstance(out[1], nd.Mirrored)
    assert out[1].devices == TWO
    for component in out[1].values:
        assert component.dtype == torch.int64
        assert component.tolist() == [[3, 3], [3, 3]]
    assert out[2].shape == torch.Size([])
    assert out[2].item() == 3.0
    assert [v.tolist() for v in out[3].values] == [[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]] * 2
    assert out[3].values[0].data_ptr() != out[3].values[1].data_ptr()
    assert out[4].dtype == torch.float64
    assert out[4].tolist() == [3.0]


@pytest.mark.parametrize("ops_class", OPS)
def test_batch_reduce_mean_max_min(ops_class):
    a = per_replica([1.0, 5.0], [3.0, 2.0])
    b = per_replica([[-1.0]], [[4.0]])
    ops = ops_class()
    assert [v.tolist() for v in ops.batch_reduce("MEAN", [(a, "cpu:0"), (b, "cpu:0")])] == [
        [2.0, 3.5],
        [[1.5]],
    ]
    assert [v.tolist() for v in ops.batch_reduce("max", [(a, "cpu:0"), (b, "cpu:0")])] == [
        [3.0, 5.0],
        [[4.0]],
    ]
    assert [v.tolist() for v in ops.batch_reduce("Min", [(a, "cpu:0"), (b, "cpu:0")])] == [
        [1.0, 2.0],
        [[-1.0]],
    ]


def test_batch_reduce_with_small_packs_is_exact():
    values = [per_replica([float(i)] * (i + 1), [10.0 * i] * (i + 1)) for i in range(6)]
    options = nd.experimental.CommunicationOptions(bytes_per_pack=8)
    out = nd.ReductionToOneDevice().batch_reduce(
        "sum", [(v, "cpu:0") for v in values], options=options
    )
    assert [t.tolist() for t in out] == [[11.0 * i] * (i + 1) for i in range(6)]


def test_batch_reduce_of_nothing():
    assert nd.ReductionToOneDevice().batch_reduce("sum", []) == []


# -- broadcast ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ops_class", OPS)
def test_broadcast(ops_class):
    tensor = torch.tensor([1.0, 2.0])
    ops = ops_class()
    mirrored = ops.broadcast(tensor, list(TWO))
    assert isinstance(mirrored, nd.Mirrored)
    assert mirrored.devices == TWO
    assert [v.tolist() for v in mirrored.values] == [[1.0, 2.0], [1.0, 2.0]]
    assert mirrored.values[0].data_ptr() != mirrored.values[1].data_ptr()
    one = ops.broadcast(tensor, "cpu:0")
    assert type(one) is torch.Tensor
    assert one.tolist() == [1.0, 2.0]


# -- errors -------------------------------------------------------------------------------------
def test_plain_tensor_sum_over_two_replicas_raises():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        with pytest.raises(ValueError, match=r"plain tensor cannot be SUM-reduced over 2 replicas"):
            strategy.extended.reduce_to("sum", torch.tensor(1.0), "cpu:0")
        with pytest.raises(ValueError, match=r"Pass the PerReplica value.*or use MEAN"):
            strategy.extended.cross_device_ops.reduce("sum", torch.tensor(1.0), "cpu:0")


def test_plain_tensor_mean_returns_the_value():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        one = strategy.extended.reduce_to("mean", torch.tensor([1.0, 2.0]), "cpu:0")
        both = strategy.extended.reduce_to("mean", torch.tensor([1.0, 2.0]), list(TWO))
    assert one.tolist() == [1.0, 2.0]
    assert isinstance(both, nd.Mirrored)
    assert [v.tolist() for v in both.values] == [[1.0, 2.0], [1.0, 2.0]]


def test_plain_tensor_with_one_replica_sums_to_itself():
    assert nd.ReductionToOneDevice().reduce("sum", torch.tensor(2.0), "cpu:0").item() == 2.0


@pytest.mark.parametrize("ops_class", OPS)
def test_shape_mismatch_names_replicas_and_shapes(ops_class):
    value = nd.PerReplica([torch.ones(2), torch.ones(3)])
    with pytest.raises(ValueError, match=r"replica 0: \(2,\), replica 1: \(3,\)"):
        ops_class().reduce("sum", value, "cpu:0")
    with pytest.raises(ValueError, match=r"different shapes.*same shape"):
        ops_class().batch_reduce("sum", [(value, "cpu:0")])


def test_nccl_on_cpu_devices_raises_naming_the_alternatives():
    with pytest.raises(
        ValueError,
        match=r"NcclAllReduce needs CUDA GPUs.*'cpu:0', 'cpu:1'.*ReductionToOneDevice\(\).*"
        r"HierarchicalCopyAllReduce\(\)",
    ):
        nd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=nd.NcclAllReduce())


def test_unknown_reduce_op_lists_the_names():
    value = per_replica(1.0, 2.0)
    with pytest.raises(ValueError, match=r"Unknown reduce op 'prod'.*'SUM', 'MEAN', 'MAX', 'MIN'"):
        nd.ReductionToOneDevice().reduce("prod", value, "cpu:0")
    with pytest.raises(ValueError, match=r"Unknown reduce op 'avg'.*'SUM', 'MEAN', 'MAX', 'MIN'"):
        nd.ReductionToOneDevice().batch_reduce("avg", [(value, "cpu:0")])


def test_unknown_destination_device_raises():
    with pytest.raises(
        ValueError, match=r"Unknown device 'tpu:0'\. Devices on this machine: cpu:0"
    ):
        nd.ReductionToOneDevice().reduce("sum", per_replica(1.0, 2.0), "tpu:0")


# -- CommunicationOptions -----------------------------------------------------------------------
def test_communication_options_defaults():
    options = nd.experimental.CommunicationOptions()
    assert options.bytes_per_pack == 0
    assert options.timeout_seconds is None
    assert options.timeout == 300.0
    assert options.implementation is nd.experimental.CommunicationImplementation.AUTO
    assert options.compression is None


def test_communication_options_normalise_names():
    options = nd.experimental.CommunicationOptions(
        bytes_per_pack=1024, timeout_seconds=5, implementation="ring", compression="FP16"
    )
    assert options.bytes_per_pack == 1024
    assert options.timeout == 5.0
    assert options.implementation is nd.experimental.CommunicationImplementation.RING
    assert options.compression == "fp16"
    assert nd.experimental.CommunicationOptions(compression="bf16").compression == "bf16"
    nccl = nd.experimental.CommunicationImplementation.NCCL
    assert nd.experimental.CommunicationOptions(implementation=nccl).implementation is nccl


def test_communication_options_bytes_per_pack_negative():
    with pytest.raises(ValueError, match=r"bytes_per_pack must be a whole number of bytes >= 0"):
        nd.experimental.CommunicationOptions(bytes_per_pack=-1)


def test_communication_options_timeout_zero():
    with pytest.raises(ValueError, match=r"timeout_seconds must be a positive number.*got 0"):
        nd.experimental.CommunicationOptions(timeout_seconds=0)


def test_communication_options_unknown_compression():
    with pytest.raises(ValueError, match=r"compression must be None, 'fp16' or 'bf16'.*'int8'"):
        nd.experimental.CommunicationOptions(compression="int8")


def test_communication_options_unknown_implementation():
    with pytest.raises(
        ValueError, match=r"Unknown communication implementation 'tcp'.*AUTO, RING, NCCL"
    ):
        nd.experimental.CommunicationOptions(implementation="tcp")


def test_collective_communication_is_an_alias():
    assert nd.experimental.CollectiveCommunication is nd.experimental.CommunicationImplementation
    assert {m.name for m in nd.experimental.CommunicationImplementation} == {
        "AUTO",
        "RING",
        "NCCL",
    }


# -- telemetry ----------------------------------------------------------------------------------
def _check_record(record: CollectiveRecord, replicas: tuple[int, ...]) -> None:
    assert isinstance(record, CollectiveRecord)
    assert record.replicas == replicas
    assert record.duration >= 0.0
    assert len(record.waits) == len(replicas)
    assert all(w >= 0.0 for w in record.waits)
    assert isinstance(record.implementation, str)
    assert record.implementation


def test_telemetry_records_all_reduce_and_reduce_to():
    strategy = nd.MirroredStrategy(list(TWO))
    telemetry = strategy.extended.telemetry
    assert len(telemetry) == 0
    with strategy.scope():
        summed = strategy.run(
            lambda: nd.get_replica_context().all_reduce("sum", torch.ones(3) * (replica_id() + 1))
        )
        reduced = strategy.extended.reduce_to("sum", summed, "cpu:0")
    assert reduced.tolist() == [6.0, 6.0, 6.0]
    records = telemetry.records()
    assert [r.op for r in records] == ["all_reduce:SUM", "reduce:SUM"]
    all_reduce, reduce_to = records
    _check_record(all_reduce, (0, 1))
    assert all_reduce.nbytes == 12  # three float32 per replica
    _check_record(reduce_to, (0, 1))
    assert reduce_to.start >= all_reduce.start


def test_telemetry_reduce_to_records_bytes_per_replica():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        value = strategy.run(lambda: torch.ones(2) * (replica_id() + 1))
        strategy.extended.reduce_to("sum", value, "cpu:0")
    (record,) = strategy.extended.telemetry.records()
    assert record.op == "reduce:SUM"
    assert record.nbytes == 8


def test_telemetry_batch_reduce_to_records_the_replicas():
    strategy = nd.MirroredStrategy(list(TWO))
    with strategy.scope():
        value = strategy.run(lambda: torch.ones(2) * (replica_id() + 1))
        out = strategy.extended.batch_reduce_to(
            "sum", [(value, "cpu:0"), (value, "cpu:0"), (value, "cpu:0")]
        )
    assert [t.tolist() for t in out] == [[3.0, 3.0]] * 3
    (record,) = strategy.extended.telemetry.records()
    assert record.op == "batch_reduce:SUM"
    assert record.nbytes == 24  # three float32[2] per replica
    _check_record(record, (0, 1))


def test_telemetry_records_all_gather_and_merge_call():
    strategy = nd.MirroredStrategy(list(TWO))

    def step():
        ctx = nd.get_replica_context()
        ctx.all_gather(torch.ones(2, 1), axis=0)
        ctx.merge_call(lambda s: None)

    strategy.run(step)
    records = strategy.extended.telemetry.records()
    assert [r.op for r in records] == ["all_gather:0", "merge_call"]
    assert records[0].nbytes == 8
    for record in records:
        _check_record(record, (0, 1))


def test_telemetry_capacity_keeps_the_newest():
    telemetry = Telemetry(capacity=2)
    for i in range(5):
        telemetry.record(f"op{i}", i, "local", (0, 1), float(i), 0.5, (0.5, 0.0))
    assert len(telemetry) == 2
    records = telemetry.records()
    assert [r.op for r in records] == ["op3", "op4"]
    assert [r.nbytes for r in records] == [3, 4]
    assert records[1].bandwidth == 8.0
    telemetry.clear()
    assert telemetry.records() == []


def test_telemetry_disabled_records_nothing():
    telemetry = Telemetry(enabled=False)
    telemetry.record("op", 4, "local", (0,), 0.0, 0.0, (0.0,))
    assert len(telemetry) == 0
    assert CollectiveRecord("op", 4, "local", (0,), 0.0, 0.0, (0.0,)).bandwidth == 0.0


@pytest.mark.parametrize("options", [{"timeout_seconds": 5}, "fast"])
def test_reduce_and_batch_reduce_refuse_options_that_are_not_communication_options(options):
    ops = nd.ReductionToOneDevice()
    value = nd.PerReplica([torch.ones(2), torch.ones(2)])
    with pytest.raises(nd.errors.ArgumentTypeError, match="CommunicationOptions or None"):
        ops.reduce("sum", value, "cpu:0", options=options)
    with pytest.raises(nd.errors.ArgumentTypeError, match="CommunicationOptions or None"):
        ops.batch_reduce("sum", [(value, "cpu:0")], options=options)
    assert (
        ops.reduce("sum", value, "cpu:0", options=nd.experimental.CommunicationOptions())[0].item()
        == 2.0
    )


def test_hierarchical_copy_num_packs_splits_a_batch_into_that_many_packs():
    class Counting(nd.HierarchicalCopyAllReduce):
        packs = 0

        def reduce_packed(self, *args, **kwargs):
            Counting.packs += 1
            return super().reduce_packed(*args, **kwargs)

    # Integer MEAN cannot be fused in place, so the batch goes through packs.
    values = [
        (nd.PerReplica([torch.full((8,), i), torch.full((8,), i + 2)]), "cpu:0") for i in range(4)
    ]
    for num_packs, expected in [(1, 1), (2, 2), (4, 4)]:
        Counting.packs = 0
        out = Counting(num_packs=num_packs).batch_reduce("mean", values)
        assert Counting.packs == expected
        assert [float(t[0]) for t in out] == [1.0, 2.0, 3.0, 4.0]
