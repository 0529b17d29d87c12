"""nbdist.input's prefetching: steps in flight, errors read ahead raised in their turn, CUDA
fetches.
"""

from __future__ import annotations

import pytest
import torch

from nbdist.input import DistributedIterator, InputOptions, distribute_dataset
from nbdist.input.transfer import Staged
from tests.unit.input.helpers import assert_tensors, dist, make_loader


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
