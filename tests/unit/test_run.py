"""`strategy.run` and the replica collectives: results, failures, and no hangs (API.md §3)."""

import threading
import time

import pytest
import torch

import nbdist as nd

TWO = ["cpu:0", "cpu:1"]


def quick(devices=TWO, seconds=2.0):
    """A strategy whose collectives give up after `seconds`."""
    strategy = nd.MirroredStrategy(devices)
    strategy._group.timeout = seconds
    return strategy


def test_run_returns_identical_objects_as_themselves_and_others_per_replica():
    strategy = nd.MirroredStrategy(TWO)
    marker = object()
    same, different = strategy.run(
        lambda: (marker, nd.get_replica_context().replica_id_in_sync_group)
    )
    assert same is marker
    assert isinstance(different, nd.PerReplica) and different.values == (0, 1)


def test_run_unwraps_distributed_arguments_at_any_depth():
    strategy = nd.MirroredStrategy(TWO)
    value = nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    out = strategy.run(lambda d, k: d["x"][0] * 10 + k, args=({"x": [value]},), kwargs={"k": 1})
    assert [t.item() for t in out.values] == [11.0, 21.0]


def test_run_propagates_grad_mode_to_replica_threads():
    strategy = nd.MirroredStrategy(TWO)
    with torch.no_grad():
        modes = strategy.run(torch.is_grad_enabled)
    assert modes is False


def test_all_reduce_every_op_and_nested_structures():
    strategy = nd.MirroredStrategy(TWO)

    def fn():
        ctx = nd.get_replica_context()
        x = torch.tensor([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1)
        return {op: ctx.all_reduce(op, {"x": x, "n": torch.tensor(3)}) for op in
                ("sum", "mean", "max", "min")}  # fmt: skip

    out = strategy.run(fn)
    for replica in range(2):
        local = {op: {k: v.values[replica] if isinstance(v, nd.PerReplica) else v
                      for k, v in d.items()} for op, d in out.items()}  # fmt: skip
        assert local["sum"]["x"].tolist() == [3.0, 6.0] and local["sum"]["n"].item() == 6
        assert local["mean"]["x"].tolist() == [1.5, 3.0]
        assert local["max"]["x"].tolist() == [2.0, 4.0]
        assert local["min"]["x"].tolist() == [1.0, 2.0]


def test_all_reduce_gives_each_replica_its_own_tensor():
    strategy = nd.MirroredStrategy(TWO)
    out = strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(3)))
    a, b = out.values
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_all_gather_in_replica_order():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])

    def fn():
        ctx = nd.get_replica_context()
        return ctx.all_gather(torch.full((1, 2), float(ctx.replica_id_in_sync_group)), axis=0)

    out = strategy.run(fn)
    for tensor in out.values:
        assert tensor.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_merge_call_merges_arguments_and_unwraps_the_result():
    strategy = nd.MirroredStrategy(TWO)
    shared = torch.tensor(5.0)
    seen = {}

    def merge_fn(s, value, same):
        seen["value"], seen["same"] = value, same
        return nd.PerReplica([value.values[1], value.values[0]])

    def fn():
        ctx = nd.get_replica_context()
        mine = torch.tensor(float(ctx.replica_id_in_sync_group))
        return ctx.merge_call(merge_fn, args=(mine, shared))

    out = strategy.run(fn)
    assert isinstance(seen["value"], nd.PerReplica) and seen["same"] is shared
    assert [t.item() for t in out.values] == [1.0, 0.0]


def test_exception_in_one_replica_names_it_and_releases_the_others():
    strategy = quick(seconds=30.0)

    def fn():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            raise KeyError("boom")
        return ctx.all_reduce("sum", torch.ones(1))

    started = time.monotonic()
    with pytest.raises(KeyError, match=r"replica 1 of 2.*boom"):
        strategy.run(fn)
    assert time.monotonic() - started < 10, "replica 0 was not released at once"
    # The strategy stays usable.
    assert strategy.run(lambda: 1) == 1


def test_value_error_keeps_its_type():
    strategy = nd.MirroredStrategy(TWO)

    def fn():
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match=r"\[replica 0 of 2\] bad shape"):
        strategy.run(fn)


def test_collective_reached_by_one_replica_fails_at_once_naming_the_missing_one():
    strategy = quick(seconds=60.0)

    def fn():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            return ctx.all_reduce("sum", torch.ones(1))
        return None

    started = time.monotonic()
    with pytest.raises(nd.ReplicaReleasedError, match=r"Replica\(s\) 1 returned .* all_reduce"):
        strategy.run(fn)
    assert time.monotonic() - started < 10


def test_merge_call_reached_by_one_replica_times_out_naming_the_straggler():
    strategy = quick(seconds=0.5)
    release = threading.Event()

    def fn():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            release.wait(timeout=2)  # busy elsewhere, never arrives in time
            return None
        return ctx.merge_call(lambda s: 1)

    started = time.monotonic()
    with pytest.raises(nd.CollectiveTimeoutError, match=r"replica\(s\) 1 never arrived") as info:
        try:
            strategy.run(fn)
        finally:
            release.set()
    assert info.value.missing == (1,)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - started < 10


def test_per_call_timeout_option():
    strategy = nd.MirroredStrategy(TWO)
    release = threading.Event()
    options = nd.experimental.CommunicationOptions(timeout_seconds=0.3)

    def fn():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            release.wait(timeout=2)
            return None
        return ctx.all_reduce("sum", torch.ones(1), options=options)

    with pytest.raises(nd.CollectiveTimeoutError, match=r"waited 0\.3 s"):
        try:
            strategy.run(fn)
        finally:
            release.set()


def test_replicas_calling_different_collectives_is_a_clear_error():
    strategy = quick(seconds=5.0)

    def fn():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            return ctx.all_reduce("sum", torch.ones(1))
        return ctx.all_gather(torch.ones(1), axis=0)

    with pytest.raises(nd.CollectiveMismatchError, match="called different collectives"):
        strategy.run(fn)


def test_all_reduce_of_different_shapes_is_a_value_error_naming_both():
    strategy = quick(seconds=5.0)

    def fn():
        ctx = nd.get_replica_context()
        return ctx.all_reduce("sum", torch.ones(ctx.replica_id_in_sync_group + 1))

    with pytest.raises(ValueError, match=r"replica 0 passed \(1,\) float32 but replica 1"):
        strategy.run(fn)


def test_non_callable_run_and_merge_call():
    strategy = nd.MirroredStrategy(TWO)
    with pytest.raises(TypeError, match="needs a function"):
        strategy.run(42)


def test_run_places_tensors_created_inside_on_one_device_strategy():
    strategy = nd.OneDeviceStrategy("cpu")
    out = strategy.run(lambda: torch.ones(2))
    assert out.device.type == "cpu"


@pytest.mark.parametrize(
    "strategy",
    [nd.get_strategy(), nd.OneDeviceStrategy("cpu"), nd.MirroredStrategy(TWO)],
    ids=["default", "one_device", "mirrored"],
)
@pytest.mark.parametrize("options", [{"experimental_enable_dynamic_batch_size": True}, "xla"])
def test_run_refuses_options_it_does_not_support(strategy, options):
    calls = []
    with pytest.raises(nd.errors.UnsupportedOptionError, match="supports no run options") as info:
        strategy.run(lambda: calls.append(1), options=options)
    assert repr(options) in str(info.value) and isinstance(info.value, ValueError)
    assert calls == []  # refused before any replica ran
    assert strategy.run(lambda: 3, options=None) == 3
