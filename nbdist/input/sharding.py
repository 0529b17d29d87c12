"""Sharding a map-style DataLoader by index, so that each worker reads only its replicas' rows.

With several workers, `distribute_dataset` over a plain `torch.utils.data.DataLoader` whose
dataset is map-style (it has a batch sampler and `__getitem__`) does not read every global
batch and keep a slice: `shard_loader` builds, for this worker, a DataLoader over the same
dataset whose batch sampler (`WorkerBatchSampler`) draws each global batch of indices from the
original batch sampler and keeps only the indices of this worker's replicas, under
TensorFlow's split (`split_batch`). The shuffle order, seeds and `drop_last` are therefore the
original loader's; every worker must draw the same global batches, which is why shuffling
without a seeded generator is refused. Anything else (an iterable dataset, a DataLoader
subclass, a list, a generator) is read whole on every worker (`split_steps`).

Imports nbdist.input.batches and nbdist.input.errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from nbdist.input.batches import Batch, empty_like, split_batch, warn_if_empty
from nbdist.input.errors import InputError
from nbdist.input.loaders import loader_settings
from nbdist.input.position import Position, Resume, skip_global_batches

__all__ = ["ShardedLoader", "WorkerBatchSampler", "shard_loader"]

_RANDOM_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)

# What the worker does with one global batch (kept in order by `WorkerBatchSampler`):
_READ = "read"  # its share was given to the DataLoader; split it over the local replicas
_SKIP = "skip"  # its share is empty: nothing read; 0 rows shaped like a batch it reads
_PROBE = "probe"  # (not a global batch) it read nothing all epoch, so it read one row at the
#                   end to learn the structure of its empty batches


class WorkerBatchSampler(Sampler[list[int]]):
    """This worker's part of each global batch of indices drawn from `batch_sampler`.

    For each global batch of `k` indices it keeps the indices of global replicas
    `replica_ids` under `split_batch(k, total)` (they are contiguous), in order. A worker
    whose share is empty yields nothing for that batch; if it yields nothing all epoch, it
    finally yields the first index of the epoch's first batch (a probe, so that the structure
    of its empty batches is known). `record` (renewed by each `iter`) says, per global batch
    in order, what was done and how many rows each local replica takes, and ends with the
    probe if there was one. `len()` is the number of global batches.

    Example:
        >>> import warnings
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> sampler = WorkerBatchSampler(BatchSampler(SequentialSampler(range(9)), 8, False),
        ...                              replica_ids=(1,), total=2)
        >>> with warnings.catch_warnings(record=True) as said:  # the 9th row alone: one empty
        ...     warnings.simplefilter("always")
        ...     taken = list(sampler)
        >>> taken, list(sampler.record), [type(w.message).__name__ for w in said]
        ([[4, 5, 6, 7]], [('read', (4,)), ('skip', (0,))], ['EmptyReplicaBatchWarning'])
    """

    def __init__(
        self, batch_sampler: Iterable[Sequence[int]], replica_ids: Sequence[int], total: int
    ):
        self.batch_sampler = batch_sampler
        self._replica_ids, self._total = tuple(replica_ids), total
        self.record: deque[tuple[str, tuple[int, ...]]] = deque()
        self.rows: deque[int] = deque()  # each global batch's size, in the order of `record`
        self.resume: Resume | None = None  # skip these global batches in the next epoch only

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        self.record, self.rows = deque(), deque()
        resume, self.resume = self.resume, None
        return self._shares(self.record, self.rows, resume)

    def _shares(
        self,
        record: deque[tuple[str, tuple[int, ...]]],
        rows: deque[int],
        resume: Resume | None,
    ) -> Iterator[list[int]]:
        yielded, probe = False, None
        batches = iter(self.batch_sampler)
        if resume is not None and resume.batches:  # drawn, not read (Note [Iterator position])
            skip_global_batches(batches, resume, len)
        for batch in batches:
            indices = list(batch)
            rows.append(len(indices))
            split = split_batch(len(indices), self._total)
            warn_if_empty(split, f"Batch {len(rows) - 1} of the dataset")
            bounds = [split[r] for r in self._replica_ids]
            sizes = tuple(stop - start for start, stop in bounds)
            start, stop = bounds[0][0], bounds[-1][1]
            if stop > start or not indices:  # an empty global batch goes through as it is
                record.append((_READ, sizes))
                yielded = True
                yield indices[start:stop]
            else:
                record.append((_SKIP, sizes))
                probe = indices[0] if probe is None else probe
        if not yielded and probe is not None:
            record.append((_PROBE, ()))
            yield [probe]


class ShardedLoader:
    """This worker's DataLoader over its shares of the global batches, and its steps.

    Built by `shard_loader`. `loader` is the worker's DataLoader (its `batch_sampler` a
    `WorkerBatchSampler`); `steps()` is one epoch of per-local-replica batches, one step per
    global batch, like `split_steps` over the original loader.
    """

    def __init__(self, loader: DataLoader, sampler: WorkerBatchSampler):
        self.loader, self.sampler = loader, sampler

    def steps(
        self, *, position: Position | None = None, resume: Resume | None = None
    ) -> Iterator[list[Any]]:
        """One epoch: per global batch, this worker's local replicas' batches.

        `position` and `resume` as in `split_steps`; skipped global batches are drawn from
        the batch sampler but never read.
        """
        self.sampler.resume = resume
        batches = iter(self.loader)
        record = self.sampler.record  # the record of the epoch `iter` just started
        global_rows = self.sampler.rows
        fetched: deque[Any] = deque()
        last: Batch | None = None
        index = 0
        while True:
            if not record:  # advance the loader (and so its sampler) to learn what comes next
                try:
                    fetched.append(next(batches))
                except StopIteration:
                    if not record:
                        return
            kind, sizes = record.popleft()
            if kind != _PROBE and position is not None:
                position.produced(global_rows.popleft())
            if kind == _SKIP:
                if last is None:  # take the structure from the next batch read (or the probe)
                    if not fetched:
                        fetched.append(next(batches))
                    last = Batch.of(fetched[0], where="The first batch this worker read")
                yield [empty_like(last) for _ in sizes]
                index += 1
                continue
            structure = fetched.popleft() if fetched else next(batches)
            if kind == _PROBE:
                continue
            batch = Batch.of(structure, where=f"Batch {index} of the dataset")
            if batch.rows is not None and batch.rows != sum(sizes):
                raise InputError(
                    f"Batch {index} of the dataset has {batch.rows} rows but this worker asked "
                    f"the DataLoader for {sum(sizes)} indices; with several workers a "
                    f"DataLoader is sharded by index, so its collate_fn must give one row per "
                    f"index. Pass an iterable that is not a DataLoader (e.g. a class whose "
                    f"__iter__ yields from the loader) to have every worker read whole global "
                    f"batches instead."
                )
            last = batch
            index += 1
            if batch.rows is None:
                yield [batch.whole() for _ in sizes]
            else:
                starts = [sum(sizes[:j]) for j in range(len(sizes))]
                yield [batch.take(s, s + n) for s, n in zip(starts, sizes)]


def shard_loader(
    dataset: Any, replica_ids: tuple[int, ...], total: int, num_workers: int
) -> ShardedLoader | None:
    """This worker's sharded loader, or None when `dataset` is read whole on every worker.

    Shards when there are several workers and `dataset` is a `DataLoader` (not a subclass,
    whose iteration may differ) over a map-style dataset with a batch sampler. The new
    DataLoader keeps the original's settings (worker processes, collate_fn, pin_memory,
    worker_init_fn, generator, ...) and reuses its batch sampler, so the shuffled order, seeds
    and `drop_last` are the original's. It is built once, so persistent workers persist.

    Raises:
        ValueError: the loader shuffles without a generator (each process would shuffle
            differently), already shards with a `DistributedSampler`, or has `in_order=False`.
    """
    if num_workers <= 1 or type(dataset) is not DataLoader:
        return None
    loader: DataLoader = dataset
    data = loader.dataset
    if (
        loader.batch_sampler is None
        or isinstance(data, IterableDataset)
        or not hasattr(type(data), "__getitem__")
    ):
        return None
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    for sampler in samplers:
        _check_sampler(sampler, num_workers)
    if loader.num_workers > 0 and not getattr(loader, "in_order", True):
        raise InputError(
            f"This DataLoader has in_order=False, so its batches may arrive in any order; with "
            f"{num_workers} workers each worker reads its part of every global batch, and the "
            f"parts must come in the sampler's order to form the same steps on every worker. "
            f"Use in_order=True (the default)."
        )
    sampler = WorkerBatchSampler(loader.batch_sampler, replica_ids, total)
    settings: dict[str, Any] = loader_settings(loader)
    for name in ("pin_memory_device", "in_order"):  # newer torch only
        if hasattr(loader, name):
            settings[name] = getattr(loader, name)
    return ShardedLoader(DataLoader(data, batch_sampler=sampler, **settings), sampler)


def _check_sampler(sampler: Any, num_workers: int) -> None:
    if isinstance(sampler, _RANDOM_SAMPLERS) and sampler.generator is None:
        raise InputError(
            f"This DataLoader shuffles ({type(sampler).__name__}) without a generator, so each "
            f"of the {num_workers} worker processes would draw its own order from its own "
            f"global RNG; the workers share out every global batch by index, so different "
            f"orders would read some rows twice and others never. Give every worker the same "
            f"seeded generator: DataLoader(..., shuffle=True, "
            f"generator=torch.Generator().manual_seed(SEED)) with the same SEED on each worker."
        )
    if isinstance(sampler, DistributedSampler) and sampler.num_replicas > 1:
        raise InputError(
            f"This DataLoader's sampler is a DistributedSampler (num_replicas="
            f"{sampler.num_replicas}), which already gives each process its own part of the "
            f"data; experimental_distribute_dataset expects global batches and shares them out "
            f"over the {num_workers} workers itself. Drop the DistributedSampler (with shuffle="
            f"True, pass a seeded generator), or build per-worker pipelines with "
            f"distribute_datasets_from_function."
        )
