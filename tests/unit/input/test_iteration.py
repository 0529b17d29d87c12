"""nbdist.input: iterating a distributed dataset (epochs, get_next, len, one-shot iterators, repr
and devices).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from nbdist.core.values import PerReplica
from nbdist.errors import NbdistError
from nbdist.input import DistributedIterator, InputOptions, distribute_dataset
from tests.unit.input.helpers import assert_tensors, components, dist, make_loader


def every_component(structure) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(structure, is_leaf=lambda v: isinstance(v, PerReplica))
    return [c for leaf in leaves for c in components(leaf)]


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
