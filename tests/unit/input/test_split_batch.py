"""nbdist.input.split_batch: a global batch split over replicas as TensorFlow splits it, each
replica's rows and empty slices.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from nbdist.core.values import PerReplica
from nbdist.input import split_batch
from nbdist.input.batches import EmptyReplicaBatchWarning
from tests.unit.input.helpers import assert_tensors, dist

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
