"""nbdist.input: batches that are structures (tuples, dicts, namedtuples, numpy arrays) dealt to
replicas leaf by leaf.
"""

from __future__ import annotations

import collections

import numpy as np
import torch

from nbdist.core.values import PerReplica
from nbdist.input import InputOptions
from tests.unit.input.helpers import assert_tensors, dist

Pair = collections.namedtuple("Pair", ["features", "label"])


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
