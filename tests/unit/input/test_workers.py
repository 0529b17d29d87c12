"""nbdist.input over several workers: every row seen exactly once, each worker's slice of the
global split.
"""

from __future__ import annotations

import pytest
import torch

from nbdist.input import split_batch
from tests.unit.input.helpers import assert_tensors, components, dist


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
