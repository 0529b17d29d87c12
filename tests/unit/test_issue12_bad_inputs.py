"""Issue 12's bad inputs that need no engines: far too many engines, a device given as a plain
string, and a distributed dataset with fewer examples than replicas."""

from __future__ import annotations

import time
import warnings

import psutil
import pytest
import torch

import nbdist as nd
from nbdist.errors import InvalidArgumentError
from nbdist.input.batches import EmptyReplicaBatchWarning


def test_a_million_engines_are_refused_before_anything_starts_naming_the_capacity():
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    begin = time.monotonic()
    with pytest.raises(InvalidArgumentError) as caught:
        nd.Cluster(n=10**6)
    assert time.monotonic() - begin < 5.0
    message = str(caught.value)
    assert "n=1000000" in message and "CPU cores" in message and "MiB of memory" in message
    assert "Pass n=" in message
    after = {child.pid for child in psutil.Process().children(recursive=True)}
    assert after <= before  # nothing was started


def test_a_plain_device_string_is_one_device_by_design():
    """`MirroredStrategy("cpu:0")` is accepted as `["cpu:0"]` (documented in docs/errors.md)."""
    strategy = nd.MirroredStrategy("cpu:0")
    assert strategy.num_replicas_in_sync == 1
    assert list(strategy.extended.worker_devices) == ["cpu:0"]


def test_fewer_examples_than_replicas_warn_and_the_axis_0_mean_is_right():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    data = [torch.tensor([[3.0]])]  # one global batch of 1 example for 2 replicas
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(strategy.experimental_distribute_dataset(data))
    assert len(batches) == 1
    found = [w for w in caught if issubclass(w.category, EmptyReplicaBatchWarning)]
    assert found, [str(w.message) for w in caught]
    text = str(found[0].message)
    assert "replica(s) [1] get an empty batch" in text and "axis=0" in text
    per_example = strategy.run(lambda x: x.sum(dim=1), args=(batches[0],))
    mean = strategy.reduce("MEAN", per_example, axis=0)
    assert float(mean) == 3.0  # the empty replica contributes nothing: no nan


def test_full_batches_do_not_warn():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", EmptyReplicaBatchWarning)
        batches = list(strategy.experimental_distribute_dataset([torch.ones(4, 1)]))
    assert len(batches) == 1
