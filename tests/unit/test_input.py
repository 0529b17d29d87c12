"""nbdist.input: splitting global batches, dealing per-replica batches, options and contexts."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, TensorDataset

from nbdist.core.values import PerReplica
from nbdist.errors import NbdistError
from nbdist.input import (
    DistributedDataset,
    DistributedIterator,
    InputContext,
    InputOptions,
    InputReplicationMode,
    ValueContext,
    distribute_dataset,
    distribute_datasets_from_function,
    split_batch,
)
from nbdist.input.batches import EmptyReplicaBatchWarning
from nbdist.input.transfer import Staged

Pair = collections.namedtuple("Pair", ["features", "label"])


def cpus(n: int) -> tuple[str, ...]:
    return tuple(f"cpu:{i}" for i in range(n))


def dist(dataset, n=2, **kwargs):
    kwargs.setdefault("num_replicas_in_sync", n * kwargs.get("num_workers", 1))
    return distribute_dataset(dataset, devices=cpus(n), **kwargs)


def from_fn(fn, n=2, **kwargs):
    kwargs.setdefault("num_replicas_in_sync", n * kwargs.get("num_workers", 1))
    return distribute_datasets_from_function(fn, devices=cpus(n), **kwargs)


def components(value) -> list[torch.Tensor]:
    return list(value.values) if isinstance(value, PerReplica) else [value]


def every_component(structure) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(structure, is_leaf=lambda v: isinstance(v, PerReplica))
    return [c for leaf in leaves for c in components(leaf)]


def assert_tensors(actual, expected) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert torch.equal(a, torch.as_tensor(e, dtype=a.dtype)), (a, e)


# --- split_batch ------------------------------------------------------------------------------

SPLITS = {
    (8, 2): [[0, 1, 2, 3], [4, 5, 6, 7]],
    (6, 2): [[0, 1, 2], [3, 4, 5]],
    (7, 2): [[0, 1, 2, 3], [4, 5, 6]],
    (6, 4): [[0, 1], [2, 3], [4, 5], []],
    (1, 2): [[0], []],
    (0, 3): [[], [], []],
    (5, 1): [[0, 1, 2, 3, 4]],
}


@pytest.mark.parametrize(("k", "n"), list(SPLITS))
def test_split_batch_follows_tensorflow(k, n):
    bounds = split_batch(k, n)
    assert [list(range(start, stop)) for start, stop in bounds] == SPLITS[k, n]


@pytest.mark.parametrize(("k", "n"), [(-1, 2), (4, 0)])
def test_split_batch_rejects_bad_sizes(k, n):
    with pytest.raises(ValueError, match=f"k={k} and num_replicas={n}"):
        split_batch(k, n)


@pytest.mark.parametrize(("k", "n"), [(8, 2), (6, 2), (7, 2), (6, 4), (1, 2)])
def test_each_replica_gets_its_rows(k, n):
    ds = dist([torch.arange(k) * 10], n=n)
    some_empty = any(not rows for rows in SPLITS[k, n])  # 6 over 4, 1 over 2: said so
    with pytest.warns(EmptyReplicaBatchWarning) if some_empty else contextlib.nullcontext():
        (batch,) = list(ds)
    assert isinstance(batch, PerReplica)
    assert batch.replica_ids == tuple(range(n))
    assert_tensors(batch.values, [[10 * i for i in rows] for rows in SPLITS[k, n]])


def test_empty_slice_keeps_trailing_shape_and_dtype():
    with pytest.warns(EmptyReplicaBatchWarning, match=r"replica\(s\) \[3\] get an empty batch"):
        batch = next(iter(dist([torch.ones(6, 3, dtype=torch.int32)], n=4)))
    assert batch.values[3].shape == (0, 3)
    assert batch.values[3].dtype == torch.int32


# --- structures -------------------------------------------------------------------------------


def test_tuple_batch_gives_a_structure_of_per_replica_leaves():
    x, y = torch.arange(8).reshape(4, 2), torch.tensor([0, 1, 0, 1])
    batch = next(iter(dist([(x, y)])))
    assert isinstance(batch, tuple) and len(batch) == 2
    assert all(isinstance(leaf, PerReplica) for leaf in batch)
    assert_tensors(batch[0].values, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    assert_tensors(batch[1].values, [[0, 1], [0, 1]])


def test_dict_batch_with_scalar_and_string_leaves():
    batch = {"x": torch.arange(3.0), "nested": [torch.arange(3), "tag"], "epoch": 7}
    out = next(iter(dist([batch])))
    assert set(out) == {"x", "nested", "epoch"}
    assert_tensors(out["x"].values, [[0.0, 1.0], [2.0]])
    assert_tensors(out["nested"][0].values, [[0, 1], [2]])
    assert out["nested"][1] == "tag" and out["epoch"] == 7


def test_namedtuple_batch_keeps_its_type():
    out = next(iter(dist([Pair(torch.arange(4), torch.arange(4) + 100)])))
    assert type(out) is Pair
    assert_tensors(out.features.values, [[0, 1], [2, 3]])
    assert_tensors(out.label.values, [[100, 101], [102, 103]])


def test_numpy_arrays_become_tensors():
    out = next(iter(dist([(np.arange(4, dtype=np.float32), np.float64(0.5))])))
    assert_tensors(out[0].values, [[0.0, 1.0], [2.0, 3.0]])
    assert out[0].values[0].dtype == torch.float32
    assert out[1] == 0.5


def test_one_replica_yields_plain_structures():
    out = list(dist([(torch.arange(3), torch.ones(3))], n=1))
    assert len(out) == 1
    x, y = out[0]
    assert torch.equal(x, torch.arange(3)) and torch.equal(y, torch.ones(3))


def test_cpu_slices_are_views_not_copies():
    batch = torch.arange(8.0)
    for fetch in (True, False):
        options = InputOptions(experimental_fetch_to_device=fetch)
        out = next(iter(dist([batch], options=options)))
        assert out.values[0].data_ptr() == batch.data_ptr()
        assert out.values[1].data_ptr() == batch[4:].data_ptr()


# --- iteration --------------------------------------------------------------------------------


def make_loader(samples=256, batch_size=64):
    features = torch.arange(samples * 3, dtype=torch.float32).reshape(samples, 3)
    labels = torch.arange(samples) % 5
    return DataLoader(TensorDataset(features, labels), batch_size=batch_size), features, labels


def test_dataloader_over_tensor_dataset():
    loader, features, labels = make_loader()
    ds = dist(loader)
    assert len(ds) == 4
    seen_x, seen_y = [], []
    for x, y in ds:
        assert [c.shape for c in x.values] == [(32, 3), (32, 3)]
        seen_x += x.values
        seen_y += y.values
    assert torch.equal(torch.cat(seen_x), features)
    assert torch.equal(torch.cat(seen_y), labels)


def test_partial_last_batch_of_a_dataloader():
    loader, features, _ = make_loader(samples=70, batch_size=64)
    steps = list(dist(loader))
    assert [[c.shape[0] for c in x.values] for x, _ in steps] == [[32, 32], [3, 3]]
    assert torch.equal(torch.cat([c for x, _ in steps for c in x.values]), features)


def test_re_iteration_gives_the_same_epochs():
    loader, _, _ = make_loader(samples=128)
    for source in (loader, [torch.arange(4), torch.arange(4, 7)]):
        ds = dist(source)
        first = [[c.clone() for c in every_component(step)] for step in ds]
        second = [every_component(step) for step in ds]
        assert len(first) == len(second) > 0
        for a, b in zip(first, second):
            assert_tensors(a, b)


def test_get_next_and_stop_iteration():
    ds = dist([torch.arange(2), torch.arange(2, 4)])
    iterator = iter(ds)
    assert isinstance(iterator, DistributedIterator) and iter(iterator) is iterator
    assert_tensors(iterator.get_next().values, [[0], [1]])
    assert_tensors(next(iterator).values, [[2], [3]])
    with pytest.raises(StopIteration):
        iterator.get_next()
    with pytest.raises(StopIteration):
        next(iterator)


def test_len_follows_the_input():
    assert len(dist([torch.ones(2)] * 5)) == 5
    ds = dist(x for x in [torch.ones(2)])
    with pytest.raises(TypeError, match="no len"):
        len(ds)
    assert len(list(ds)) == 1  # list() falls back when len() raises TypeError


def test_one_shot_iterator_is_read_once_then_refused():
    ds = dist(torch.arange(2 * i, 2 * i + 2) for i in range(3))
    iterator = iter(ds)
    assert_tensors(next(iterator).values, [[0], [1]])
    assert_tensors(next(iter(ds)).values, [[2], [3]])  # a new epoch continues where it stopped
    assert len(list(ds)) == 1
    with pytest.raises(RuntimeError, match="one-shot iterator") as caught:
        list(ds)
    assert isinstance(caught.value, NbdistError)


def test_empty_reiterable_is_an_empty_epoch_every_time():
    ds = dist([])
    assert list(ds) == [] and list(ds) == []


def test_repr_and_properties():
    ds = dist([torch.ones(2)])
    assert ds.devices == ("cpu:0", "cpu:1")
    assert ds.options == InputOptions()
    assert repr(ds) == "<DistributedDataset of list on ['cpu:0', 'cpu:1'], replicas [0, 1]>"


def test_devices_are_normalised():
    ds = distribute_dataset([torch.ones(2)], devices=["/CPU:0", "CPU:1"], num_replicas_in_sync=2)
    assert ds.devices == ("cpu:0", "cpu:1")


# --- several workers --------------------------------------------------------------------------


@pytest.mark.parametrize("per_worker", [1, 2])
@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # 3, 1 rows
def test_workers_see_every_row_exactly_once(per_worker):
    sizes = [8, 7, 3, 1]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    batches = [torch.arange(start, start + size) for start, size in zip(starts, sizes)]
    total = 2 * per_worker
    rows_of_replica = {replica: [] for replica in range(total)}
    for worker in (0, 1):
        ds = dist(batches, n=per_worker, num_workers=2, worker_index=worker)
        ids = list(range(worker * per_worker, (worker + 1) * per_worker))
        for step in ds:
            if per_worker > 1:
                assert list(step.replica_ids) == ids
            for replica, part in zip(ids, components(step)):
                rows_of_replica[replica] += part.tolist()
    seen = [row for rows in rows_of_replica.values() for row in rows]
    assert sorted(seen) == list(range(19)) and len(seen) == 19
    for replica in range(total):  # each global replica got exactly its TF slice of each batch
        expected = []
        for start, size in zip(starts, sizes):
            lo, hi = split_batch(size, total)[replica]
            expected += list(range(start + lo, start + hi))
        assert rows_of_replica[replica] == expected


def test_worker_slices_follow_the_global_split():
    batch = torch.arange(7)
    worker1 = next(iter(dist([batch], n=2, num_workers=2, worker_index=1)))
    assert worker1.replica_ids == (2, 3)
    assert_tensors(worker1.values, [[4, 5], [6]])  # 7 over 4: 2 | 2 | 2 | 1


# --- prefetching ------------------------------------------------------------------------------


class RecordingTransfer:
    """Stands in for a CUDA transfer: records when each step's copy starts and finishes."""

    asynchronous = True

    def __init__(self):
        self.log = []

    def start(self, parts):
        self.log.append(("start", int(parts[0][0])))
        return Staged(parts, [None] * len(parts), [])

    def finish(self, staged):
        self.log.append(("finish", int(staged.parts[0][0])))
        return staged.parts


def steps_of(*firsts, fail_at=None):
    for first in firsts:
        if first == fail_at:
            raise ValueError(f"bad batch {first}")
        yield [torch.tensor([first]), torch.tensor([first + 1])]


def test_prefetch_keeps_buffer_size_steps_in_flight():
    transfer = RecordingTransfer()
    iterator = DistributedIterator(steps_of(0, 10, 20, 30), transfer, 2, (0, 1))
    assert_tensors(iterator.get_next().values, [[0], [1]])
    assert transfer.log == [("start", 0), ("start", 10), ("start", 20), ("finish", 0)]
    iterator.get_next()
    assert transfer.log[4:] == [("start", 30), ("finish", 10)]
    assert len(list(iterator)) == 2
    assert transfer.log[-1] == ("finish", 30)


def test_an_error_read_ahead_is_raised_in_its_turn():
    iterator = DistributedIterator(steps_of(0, 10, 20, fail_at=20), RecordingTransfer(), 2, (0, 1))
    iterator.get_next()
    iterator.get_next()
    with pytest.raises(ValueError, match="bad batch 20"):
        iterator.get_next()
    with pytest.raises(StopIteration):
        iterator.get_next()


def test_buffer_size_is_used_only_for_asynchronous_devices():
    ds = dist([torch.ones(2)], options=InputOptions(experimental_per_replica_buffer_size=3))
    assert iter(ds)._depth == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fetch_prefetches_to_the_device():
    loader, features, _ = make_loader(samples=256)
    options = InputOptions(experimental_per_replica_buffer_size=2)
    ds = distribute_dataset(loader, devices=("cuda:0",), num_replicas_in_sync=1, options=options)
    seen = []
    for x, _ in ds:
        assert x.device.type == "cuda"
        seen.append((x * 2).cpu())
    assert torch.equal(torch.cat(seen), features * 2)


# --- distribute_datasets_from_function --------------------------------------------------------


def test_input_context_given_to_dataset_fn_per_worker():
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        return [torch.ones(2)] * 4

    ds = from_fn(dataset_fn, n=2, num_workers=3, worker_index=1)
    assert [
        (c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts
    ] == [(3, 1, 6)]
    steps = list(ds)
    assert len(steps) == 2 and steps[0].replica_ids == (2, 3)


def test_dataset_fn_is_called_once_across_epochs():
    calls = []

    def dataset_fn(ctx):
        calls.append(ctx)
        return [torch.arange(i, i + 2) for i in range(0, 8, 2)]

    ds = from_fn(dataset_fn)
    epochs = [[step.values for step in ds] for _ in range(2)]
    assert len(calls) == 1
    for epoch in epochs:
        assert [[c.tolist() for c in step] for step in epoch] == [
            [[0, 1], [2, 3]],
            [[4, 5], [6, 7]],
        ]


def test_data_running_out_mid_step_gives_empty_batches():
    batches = [
        {"x": torch.full((2, 3), i, dtype=torch.int16), "y": torch.tensor([i, i])} for i in range(3)
    ]
    steps = list(from_fn(lambda ctx: batches))
    assert len(steps) == 2
    last = steps[1]
    assert torch.equal(last["x"].values[0], batches[2]["x"])
    empty = last["x"].values[1]
    assert empty.shape == (0, 3) and empty.dtype == torch.int16
    assert last["y"].values[1].shape == (0,)


def test_plain_leaves_stay_plain_when_equal_and_tensors_are_always_per_replica():
    shared = torch.ones(2)
    batches = [{"x": shared, "split": "train", "index": i} for i in range(2)]
    (step,) = list(from_fn(lambda ctx: batches))
    assert isinstance(step["x"], PerReplica) and step["x"].values == (shared, shared)
    assert step["split"] == "train"
    assert step["index"].values == (0, 1)


def test_epoch_ends_when_replica_zero_has_no_data():
    steps = list(from_fn(lambda ctx: [torch.ones(1)] * 4, n=2))
    assert len(steps) == 2
    assert len(from_fn(lambda ctx: [torch.ones(1)] * 5, n=2)) == 3


def test_per_replica_mode_gives_each_replica_its_pipeline():
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        rid = ctx.input_pipeline_id
        return [torch.full((2,), 10 * rid + step) for step in range(2 + rid % 2)]

    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    ds = from_fn(dataset_fn, n=2, num_workers=2, worker_index=1, options=options)
    assert [
        (c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts
    ] == [(4, 2, 4), (4, 3, 4)]
    steps = list(ds)
    assert len(ds) == 3 and len(steps) == 3
    assert steps[0].replica_ids == (2, 3)
    assert_tensors(steps[0].values, [[20, 20], [30, 30]])
    assert_tensors(steps[2].values, [[], [32, 32]])  # replica 2 ran out first
    assert len(contexts) == 2 and len(list(ds)) == 3  # re-iterated, not rebuilt


def test_place_dataset_on_device_builds_and_reads_under_the_device():
    options = InputOptions(
        experimental_replication_mode="PER_REPLICA",
        experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=False,
    )
    ds = from_fn(lambda ctx: [torch.zeros(2) + ctx.input_pipeline_id], options=options)
    (step,) = list(ds)
    assert_tensors(step.values, [[0, 0], [1, 1]])


def test_one_local_replica_from_function_is_plain():
    steps = list(from_fn(lambda ctx: [torch.ones(2), torch.zeros(2)], n=1))
    assert_tensors(steps, [[1, 1], [0, 0]])


# --- contexts and options ---------------------------------------------------------------------


def test_input_context():
    ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (2, 1, 4)
    assert ctx.get_per_replica_batch_size(64) == 16
    assert ctx.get_per_replica_batch_size(np.int64(8)) == 2
    assert str(ctx) == "nbdist.InputContext(input pipeline id 1, total: 2)"
    assert repr(ctx) == (
        "InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)"
    )
    default = InputContext()
    assert (default.num_input_pipelines, default.input_pipeline_id) == (1, 0)
    assert default.num_replicas_in_sync == 1


def test_value_context():
    ctx = ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=3)
    assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (2, 3)
    assert str(ctx) == "nbdist.ValueContext(replica id 2, total replicas in sync: 3)"
    assert repr(ctx) == "ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=3)"
    assert ValueContext().num_replicas_in_sync == 1


def test_input_options_defaults_and_normalisation():
    options = InputOptions()
    assert options.experimental_fetch_to_device is True
    assert options.experimental_replication_mode is InputReplicationMode.PER_WORKER
    assert options.experimental_place_dataset_on_device is False
    assert options.experimental_per_replica_buffer_size == 1
    assert InputOptions(experimental_fetch_to_device=None).experimental_fetch_to_device is True
    mode = InputOptions(experimental_replication_mode="per_replica").experimental_replication_mode
    assert mode is InputReplicationMode.PER_REPLICA
    assert InputReplicationMode.PER_WORKER.value == "PER_WORKER"
    assert InputReplicationMode("PER_REPLICA") is InputReplicationMode.PER_REPLICA
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.experimental_fetch_to_device = False
    with pytest.raises(TypeError):
        InputOptions(False)


# --- every bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "hint"),
    [
        (3, "not iterable"),
        (object(), "not iterable"),
        (torch.arange(4), r"pass \[batch\]"),
        (np.arange(4), r"pass \[batch\]"),
        ({"x": torch.ones(2)}, "keys"),
        (TensorDataset(torch.ones(4)), "DataLoader"),
        ("abc", "DataLoader"),
    ],
)
def test_not_an_iterable_of_batches(dataset, hint):
    with pytest.raises(TypeError, match="DataLoader, a list of batches") as caught:
        dist(dataset)
    assert caught.match(hint)
    assert isinstance(caught.value, NbdistError)


def test_indivisible_global_batch_size():
    message = r"global batch size 7 is not divisible by num_replicas_in_sync 2.*e\.g\. 6 or 8"
    with pytest.raises(ValueError, match=message):
        InputContext(num_replicas_in_sync=2).get_per_replica_batch_size(7)
    with pytest.raises(ValueError, match=r"e.g. 4\)"):
        InputContext(num_replicas_in_sync=4).get_per_replica_batch_size(3)
    with pytest.raises(ValueError, match="global_batch_size must be >= 0"):
        InputContext().get_per_replica_batch_size(-2)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_input_pipelines": 0}, ValueError, "num_input_pipelines must be >= 1, got 0"),
        ({"input_pipeline_id": 1}, ValueError, "input_pipeline_id is 1 but num_input_pipelines"),
        ({"num_replicas_in_sync": 1.5}, TypeError, "num_replicas_in_sync must be an int"),
        ({"num_replicas_in_sync": True}, TypeError, "num_replicas_in_sync must be an int"),
    ],
)
def test_bad_input_context(kwargs, error, message):
    with pytest.raises(error, match=message):
        InputContext(**kwargs)


def test_bad_value_context():
    with pytest.raises(ValueError, match="replica_id_in_sync_group is 2 but num_replicas_in_sync"):
        ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=2)


def test_inconsistent_leading_sizes():
    ds = dist([(torch.ones(8), torch.ones(7))])
    with pytest.raises(ValueError, match=r"batch\[0\]: 8, batch\[1\]: 7") as caught:
        list(ds)
    assert caught.match("Batch 0 of the dataset")


def test_zero_dimensional_tensor_leaf():
    with pytest.raises(ValueError, match="0-dimensional tensor at batch\\['step'\\]"):
        list(dist([{"x": torch.ones(2), "step": torch.tensor(3)}]))


def test_unsupported_leaf_type():
    with pytest.raises(TypeError, match="leaf of type object at batch\\[1\\]"):
        list(dist([(torch.ones(2), object())]))


@pytest.mark.parametrize("name", ["batch", "map", "shuffle", "rebatch", "repeat", "prefetch"])
def test_transformations_are_refused(name):
    ds = dist([torch.ones(2)])
    with pytest.raises(AttributeError, match=f"cannot be re-batched or transformed: .{name}") as c:
        getattr(ds, name)(2)
    assert c.match("before distributing")
    assert not hasattr(ds, name)
    with pytest.raises(AttributeError, match="no attribute 'element_count'"):
        ds.element_count  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"experimental_place_dataset_on_device": True, "experimental_fetch_to_device": False},
            ValueError,
            "needs experimental_replication_mode=InputReplicationMode.PER_REPLICA",
        ),
        (
            {
                "experimental_place_dataset_on_device": True,
                "experimental_replication_mode": "PER_REPLICA",
            },
            ValueError,
            "pass experimental_fetch_to_device=False",
        ),
        ({"experimental_per_replica_buffer_size": 0}, ValueError, ">= 1, got 0"),
        ({"experimental_per_replica_buffer_size": "2"}, TypeError, "an int >= 1, got '2'"),
        ({"experimental_replication_mode": "PER_HOST"}, ValueError, "got 'PER_HOST'"),
        ({"experimental_fetch_to_device": "yes"}, TypeError, "True or False, got 'yes'"),
    ],
)
def test_invalid_options(kwargs, error, message):
    with pytest.raises(error, match=message) as caught:
        InputOptions(**kwargs)
    assert isinstance(caught.value, NbdistError)


def test_options_must_be_input_options():
    with pytest.raises(TypeError, match="options must be an nbdist InputOptions"):
        dist([torch.ones(2)], options={"experimental_fetch_to_device": False})


def test_per_replica_mode_is_refused_by_distribute_dataset():
    options = InputOptions(experimental_replication_mode="PER_REPLICA")
    with pytest.raises(NotImplementedError, match="distribute_datasets_from_function"):
        dist([torch.ones(2)], options=options)


def test_dataset_fn_returning_a_non_iterable():
    def make_dataset(ctx):
        return 42

    name = "dataset_fn 'test_dataset_fn_returning_a_non_iterable.<locals>.make_dataset'"
    with pytest.raises(TypeError, match=re.escape(f"{name} must return a torch.utils.data")):
        from_fn(make_dataset)
    with pytest.raises(TypeError, match="expects dataset_fn to be a function"):
        from_fn([torch.ones(2)])


def test_replicas_given_different_structures():
    options = InputOptions(experimental_replication_mode="PER_REPLICA")
    ds = from_fn(
        lambda c: [torch.ones(2)] if c.input_pipeline_id else [(torch.ones(2),)], options=options
    )
    with pytest.raises(ValueError, match="same nested structure"):
        list(ds)


def test_len_without_an_input_length_from_function():
    ds = from_fn(lambda ctx: iter([torch.ones(2)]))
    with pytest.raises(TypeError, match="no len\\(\\) because the iterable dataset_fn"):
        len(ds)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 2, "worker_index": 2}, "worker_index is 2 but num_workers is 2"),
        ({"num_replicas_in_sync": 1}, "num_replicas_in_sync is 1; .* at least 2"),
        ({"num_workers": 0}, "num_workers must be >= 1"),
    ],
)
def test_bad_topology(kwargs, message):
    with pytest.raises(ValueError, match=message):
        distribute_dataset(
            [torch.ones(2)], devices=cpus(2), **{"num_replicas_in_sync": 2, **kwargs}
        )


def test_unknown_device():
    with pytest.raises(ValueError, match="tpu:0"):
        distribute_dataset([torch.ones(2)], devices=("tpu:0",), num_replicas_in_sync=1)


def test_steps_per_epoch_from_function_length():
    assert len(from_fn(lambda ctx: [torch.ones(1)] * 3, n=2)) == math.ceil(3 / 2)
    assert isinstance(from_fn(lambda ctx: [], n=2), DistributedDataset)
    assert list(from_fn(lambda ctx: [], n=2)) == []


def test_numpy_array_torch_cannot_hold():
    with pytest.raises(TypeError, match="numpy array of dtype <U1 at batch\\[1\\]"):
        list(dist([(torch.ones(2), np.array(["a", "b"]))]))


def test_buffer_size_must_not_be_a_bool():
    with pytest.raises(TypeError, match="an int >= 1, got True"):
        InputOptions(experimental_per_replica_buffer_size=True)
