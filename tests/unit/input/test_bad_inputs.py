"""nbdist.input: every bad input gets an nbdist error that names the problem and the fix."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from nbdist.errors import NbdistError
from nbdist.input import (
    DistributedDataset,
    InputContext,
    InputOptions,
    ValueContext,
    distribute_dataset,
)
from tests.unit.input.helpers import cpus, dist, from_fn


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
