"""Distributed datasets and iterators following a resized cluster (`%dist scale`).

Note [Following a resize]: a distributed dataset is built again for the new topology from what
it was made of (`DistributedDataset.recipe`), and an iterator continues after the global
batches it had given: its epoch is drawn again from the state its loader's random generators
had when the epoch began (`epoch_rng`, kept by `iter(dataset)`), so a shuffled `DataLoader`
gives the same order, and the batches already given are skipped (`load_state_dict`). Every
example of the epoch is then given exactly once across the change.

With `keep="replica-batch"` the global batch changes with the number of replicas: the
`DataLoader` is rebuilt with a batch size of (per-replica batch) × (new replicas), and the
rest of the epoch is the sampler's order after the examples already given, in batches of the
new size (`ResumingBatchSampler`). A checkpoint taken later in that epoch counts its batches
from the resize on.

Imports torch's DataLoader and the nbdist.input modules below it.

Example:
    >>> import torch
    >>> from torch.utils.data import SequentialSampler
    >>> sampler = ResumingBatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False)
    >>> sampler.skip = 2
    >>> list(sampler), list(sampler)[0]
    ([[2, 3, 4], [5, 6]], [0, 1, 2])
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from nbdist.input.loaders import loader_settings

__all__ = [
    "ResumingBatchSampler",
    "epoch_rng",
    "global_batch_size",
    "rebatched_loader",
    "restore_rng",
]


def _generators(source: Any) -> list[torch.Generator]:
    """The random generators a `DataLoader` draws its order and seeds from (deduplicated)."""
    found: list[torch.Generator] = []
    if not isinstance(source, DataLoader):
        return found
    batch_sampler = getattr(source, "batch_sampler", None)
    for owner in (source, source.sampler, getattr(batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(g is not generator for g in found):
            found.append(generator)
    return found


def epoch_rng(source: Any) -> list[torch.Tensor]:
    """The states of `source`'s random generators now (when an epoch begins)."""
    return [g.get_state() for g in _generators(source)]


def restore_rng(source: Any, states: list[torch.Tensor]) -> None:
    """Put `source`'s random generators back to `states` (from `epoch_rng`), so that its next
    epoch draws the order the recorded one drew."""
    generators = _generators(source)
    if len(generators) == len(states):
        for generator, saved in zip(generators, states):
            generator.set_state(saved)


class ResumingBatchSampler(Sampler[list[int]]):
    """Batches of `batch_size` indices from `sampler`; the next epoch only starts after the
    first `skip` indices (then `skip` is 0 again). `len()` is a full epoch's."""

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool):
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), bool(drop_last)
        self.skip = 0

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        batch: list[int] = []
        for position, index in enumerate(self.sampler):
            if position < skip:
                continue
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


def global_batch_size(loader: Any) -> int | None:
    """The batch size of a plain `DataLoader` (re-batched ones included), else None."""
    if type(loader) is not DataLoader:
        return None
    if isinstance(loader.batch_sampler, ResumingBatchSampler):
        return loader.batch_sampler.batch_size
    return loader.batch_size


def rebatched_loader(loader: Any, batch_size: int) -> DataLoader | None:
    """A `DataLoader` like `loader` (same dataset, sampler and settings) giving batches of
    `batch_size` through a `ResumingBatchSampler`; None when `loader` is not a plain
    `DataLoader` with a batch size (nothing to re-batch)."""
    if type(loader) is not DataLoader:
        return None
    if isinstance(loader.batch_sampler, ResumingBatchSampler):  # re-batched before
        order, drop_last = loader.batch_sampler.sampler, loader.batch_sampler.drop_last
    elif loader.batch_size is not None:
        order, drop_last = loader.sampler, loader.drop_last
    else:
        return None
    sampler = ResumingBatchSampler(order, batch_size, drop_last)
    return DataLoader(loader.dataset, batch_sampler=sampler, **loader_settings(loader))
