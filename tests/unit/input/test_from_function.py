"""nbdist.input.distribute_datasets_from_function: input contexts, one call across epochs, running
out mid-step, per-replica pipelines.
"""

from __future__ import annotations

import torch

from nbdist.core.values import PerReplica
from nbdist.input import InputOptions, InputReplicationMode
from tests.unit.input.helpers import assert_tensors, from_fn


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
