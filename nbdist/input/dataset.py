"""Distributed datasets: `distribute_dataset`, `distribute_datasets_from_function` and the
`DistributedDataset` they give (its iterator is `nbdist.input.iterator.DistributedIterator`).

Strategies call these two functions with their local devices and worker position; users reach
them as `strategy.experimental_distribute_dataset` and
`strategy.distribute_datasets_from_function`. Imports nbdist.core.values, nbdist.core.devices and
the
other nbdist.input modules.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from nbdist.core.devices import canonical_devices, physical_device
from nbdist.errors import CheckpointMismatchError
from nbdist.input.contexts import InputContext, _count
from nbdist.input.errors import (
    InputError,
    InputModeError,
    InputTransformationError,
    InputTypeError,
)
from nbdist.input.following import epoch_rng
from nbdist.input.iterator import DistributedIterator
from nbdist.input.options import InputOptions, InputReplicationMode
from nbdist.input.position import GLOBAL_BATCHES, Position, Resume
from nbdist.input.sharding import shard_loader
from nbdist.input.steps import ACCEPTED, Epochs, per_replica_steps, per_worker_steps, split_steps
from nbdist.input.transfer import DeviceTransfer

__all__ = [
    "DistributedDataset",
    "DistributedIterator",
    "distribute_dataset",
    "distribute_datasets_from_function",
]

_TRANSFORMATIONS = frozenset({
    "apply", "batch", "bucket_by_sequence_length", "cache", "concatenate", "enumerate",
    "filter", "flat_map", "group_by_window", "interleave", "map", "padded_batch", "prefetch",
    "ragged_batch", "rebatch", "repeat", "shard", "shuffle", "skip", "take", "take_while",
    "unbatch", "window", "with_options", "zip",
})  # fmt: skip


class DistributedDataset:
    """Per-replica batches, one epoch per `for` loop; built by `distribute_dataset` or
    `distribute_datasets_from_function`, not directly.

    `len()` is the number of steps per epoch when the input has a length. Transformations
    (`batch`, `map`, `shuffle`, ...) are not offered: apply them before distributing.

    Example:
        >>> ds = distribute_dataset([torch.arange(4), torch.arange(4, 6)],
        ...                         devices=("cpu:0", "cpu:1"), num_replicas_in_sync=2)
        >>> len(ds), [batch.values for batch in ds]
        (2, [(tensor([0, 1]), tensor([2, 3])), (tensor([4]), tensor([5]))])
    """

    def __init__(
        self,
        *,
        steps: Callable[[Position, Resume | None], Iterator[list[Any]]],
        length: Callable[[], int],
        devices: tuple[str, ...],
        replica_ids: tuple[int, ...],
        options: InputOptions,
        source: Any,
        kind: str,
        num_replicas_in_sync: int,
        num_workers: int,
        recipe: tuple[str, Any, InputOptions] | None = None,
    ):
        self._recipe = recipe
        self._steps, self._length, self._source = steps, length, source
        self._kind, self._num_replicas, self._num_workers = kind, num_replicas_in_sync, num_workers
        self._devices, self._replica_ids, self._options = devices, replica_ids, options
        fetch = options.experimental_fetch_to_device
        self._transfer = DeviceTransfer([physical_device(d) for d in devices] if fetch else None)
        self._depth = options.experimental_per_replica_buffer_size

    @property
    def options(self) -> InputOptions:
        """The `InputOptions` it was distributed with."""
        return self._options

    @property
    def devices(self) -> tuple[str, ...]:
        """This worker's replica devices, in local replica order."""
        return self._devices

    @property
    def recipe(self) -> tuple[str, Any, InputOptions] | None:
        """What it was made of, to make it again for another topology (Note [Following a
        resize] in nbdist.input.following): `("dataset", input, options)` or
        `("function", dataset_fn, options)`."""
        return self._recipe

    def take_over(self, other: DistributedDataset) -> None:
        """Become `other` (the same input distributed for a resized cluster), in place, so
        that names bound to this dataset follow the resize."""
        self.__dict__.update(other.__dict__)

    def __iter__(self) -> DistributedIterator:
        depth = self._depth if self._transfer.asynchronous else 0
        position = Position(
            self._kind, num_replicas_in_sync=self._num_replicas, num_workers=self._num_workers
        )
        return DistributedIterator(
            self._steps(position, None), self._transfer, depth, self._replica_ids,
            position=position, resume=lambda resume: self._steps(position, resume),
            origin=(self, epoch_rng(self._source)),
        )  # fmt: skip

    def __len__(self) -> int:
        return self._length()

    def __getattr__(self, name: str) -> Any:
        if name in _TRANSFORMATIONS:
            raise InputTransformationError(
                f"A distributed dataset cannot be re-batched or transformed: .{name}(...) is not "
                f"offered (as in TensorFlow), since it already yields per-replica batches. Apply "
                f"the transformation to the input before distributing it (e.g. "
                f"DataLoader(data, batch_size=GLOBAL_BATCH_SIZE), or your own generator)."
            )
        raise AttributeError(f"'DistributedDataset' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (
            f"<DistributedDataset of {type(self._source).__name__} on {list(self._devices)}, "
            f"replicas {list(self._replica_ids)}>"
        )


def distribute_dataset(
    dataset: Iterable[Any],
    *,
    devices: Sequence[str],
    num_replicas_in_sync: int,
    num_workers: int = 1,
    worker_index: int = 0,
    options: InputOptions | None = None,
) -> DistributedDataset:
    """Split every global batch over all replicas and yield this worker's replicas' slices.

    A batch of `k` rows is split as TensorFlow splits it (`split_batch`): 7 over 2 replicas is
    4 | 3, 6 over 4 is 2 | 2 | 2 | 0. Local replica `j` of worker `w` is global replica
    `w * len(devices) + j`; over an epoch every row is seen exactly once across workers, and
    every worker takes one step per global batch (a worker without rows in a batch gets
    0-row slices, shaped and typed like the data). Slices are views of the batch.

    With several workers, a `torch.utils.data.DataLoader` over a map-style dataset is sharded
    by index: this worker's DataLoader (same settings, built once) reads only the indices of
    its replicas' rows of each global batch that the original batch sampler draws, so
    shuffling, seeds and `drop_last` are the original's (a worker without any row in a whole
    epoch reads one row anyway, to learn the structure of its empty slices). Every worker must
    draw the same global batches: a loader that shuffles needs a generator seeded the same on
    every worker, and the workers must iterate the same epochs. Any other input (an iterable
    dataset, a DataLoader subclass, a list, a generator) is read whole on every worker, which
    keeps its slices.

    Args:
        dataset: An iterable of global batches: a DataLoader, a list, any re-iterable object.
            Each `for` loop starts a new epoch with `iter(dataset)`. A one-shot iterator (e.g.
            a generator object) is iterated once; a later epoch that finds it already spent
            raises `RuntimeError` instead of silently yielding nothing.
        devices: This worker's replica devices, e.g. `("cpu:0", "cpu:1")` or `("cuda:0",)`.
        num_replicas_in_sync: Replicas of all workers.
        num_workers: Workers (processes) reading the same dataset.
        worker_index: This worker's index.
        options: `InputOptions`; `PER_REPLICA` mode is not supported here (as in TensorFlow).

    Raises:
        TypeError: `dataset` is not an iterable of batches (checked now); a batch leaf of an
            unsupported type (when iterated).
        ValueError: bad devices, counts or options; with several workers, a DataLoader that
            shuffles without a generator, shards with a `DistributedSampler` or has
            `in_order=False`; a batch whose tensors disagree on the leading size, or a sharded
            DataLoader batch without one row per index (when iterated).
        NotImplementedError: `PER_REPLICA` replication mode.

    Example:
        >>> ds = distribute_dataset([(torch.arange(3), "train")], devices=("cpu:0", "cpu:1"),
        ...                         num_replicas_in_sync=2)
        >>> next(iter(ds))
        (PerReplica:{0: tensor([0, 1]), 1: tensor([2])}, 'train')
    """
    options = _options(options)
    if options.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
        raise InputModeError(
            "experimental_distribute_dataset does not support "
            "InputReplicationMode.PER_REPLICA (neither does TensorFlow); use "
            "distribute_datasets_from_function for per-replica pipelines, or the default "
            "PER_WORKER mode here."
        )
    _check_iterable(dataset, f"experimental_distribute_dataset expects dataset to be {ACCEPTED}")
    devices, replica_ids = _topology(devices, num_replicas_in_sync, num_workers, worker_index)
    sharded = shard_loader(dataset, replica_ids, num_replicas_in_sync, num_workers)
    source = Epochs(dataset, "the dataset")

    def steps(position: Position, resume: Resume | None) -> Iterator[list[Any]]:
        if sharded is not None:
            return sharded.steps(position=position, resume=resume)
        return split_steps(
            source, replica_ids, num_replicas_in_sync, position=position, resume=resume
        )

    return DistributedDataset(
        steps=steps,
        length=lambda: _len(dataset, "dataset"),
        devices=devices,
        replica_ids=replica_ids,
        options=options,
        source=dataset,
        kind=GLOBAL_BATCHES,
        num_replicas_in_sync=num_replicas_in_sync,
        num_workers=num_workers,
        recipe=("dataset", dataset, options),
    )


def distribute_datasets_from_function(
    dataset_fn: Callable[[InputContext], Iterable[Any]],
    *,
    devices: Sequence[str],
    num_replicas_in_sync: int,
    num_workers: int = 1,
    worker_index: int = 0,
    options: InputOptions | None = None,
) -> DistributedDataset:
    """Build per-replica-batched pipelines with `dataset_fn` and deal their batches to replicas.

    `PER_WORKER` (default): `dataset_fn(InputContext(num_workers, worker_index,
    num_replicas_in_sync))` is called once, now; each step takes one batch per local replica
    from it, replica 0's first. `PER_REPLICA`: it is called once per local replica `j`, with
    `input_pipeline_id` the global replica id and `num_input_pipelines=num_replicas_in_sync`,
    and each replica reads its own pipeline. Each epoch re-iterates the returned iterable(s);
    `dataset_fn` is never called again. When data runs out mid-step, replicas without data get
    empty batches (0 rows, shaped like the last batch read); the epoch ends when no replica
    has data left (in `PER_WORKER` mode: when replica 0 has none).

    Args:
        dataset_fn: Takes an `InputContext`, returns an iterable of per-replica batches.
        devices, num_replicas_in_sync, num_workers, worker_index: as in `distribute_dataset`.
        options: `InputOptions`.

    Raises:
        TypeError: `dataset_fn` is not callable or returns something that is not an iterable.
        ValueError: bad devices, counts or options; a bad batch (when iterated).

    Example:
        >>> ds = distribute_datasets_from_function(
        ...     lambda ctx: [torch.arange(2), torch.arange(2, 4), torch.arange(4, 5)],
        ...     devices=("cpu:0", "cpu:1"), num_replicas_in_sync=2)
        >>> [batch.values for batch in ds]
        [(tensor([0, 1]), tensor([2, 3])), (tensor([4]), tensor([], dtype=torch.int64))]
    """
    options = _options(options)
    if not callable(dataset_fn):
        raise InputTypeError(
            f"distribute_datasets_from_function expects dataset_fn to be a function taking an "
            f"InputContext and returning {ACCEPTED}, got {type(dataset_fn).__name__}."
        )
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    devices, replica_ids = _topology(
        devices, num_replicas_in_sync, num_workers, worker_index, global_ids=per_replica
    )
    name = f"dataset_fn {getattr(dataset_fn, '__qualname__', repr(dataset_fn))!r}"
    if per_replica:
        place = options.experimental_place_dataset_on_device
        scopes = [_device_scope(d if place else None) for d in devices]
        contexts = [
            InputContext(num_replicas_in_sync, r, num_replicas_in_sync) for r in replica_ids
        ]
    else:
        scopes = [_device_scope(None)]
        contexts = [InputContext(num_workers, worker_index, num_replicas_in_sync)]
    pipelines = []
    for scope, context in zip(scopes, contexts):
        with scope():
            pipeline = dataset_fn(context)
        _check_iterable(pipeline, f"{name} must return {ACCEPTED}; it returned")
        pipelines.append(pipeline)
    sources = [Epochs(p, f"the iterable {name} returned") for p in pipelines]

    def steps(position: Position, resume: Resume | None) -> Iterator[list[Any]]:
        if per_replica:
            made = per_replica_steps(sources, scopes, name)
        else:
            made = per_worker_steps(sources[0], len(devices), name)
        return _counted(made, position, resume)

    def length() -> int:
        lengths = [_len(p, f"the iterable {name} returned") for p in pipelines]
        return max(lengths) if per_replica else math.ceil(lengths[0] / len(devices))

    return DistributedDataset(
        steps=steps,
        length=length,
        devices=devices,
        replica_ids=replica_ids,
        options=options,
        source=pipelines[0],
        kind="per_replica" if per_replica else "per_worker",
        num_replicas_in_sync=num_replicas_in_sync,
        num_workers=num_workers,
        recipe=("function", dataset_fn, options),
    )


def _counted(
    steps: Iterator[list[Any]], position: Position, resume: Resume | None
) -> Iterator[list[Any]]:
    """Steps of per-worker or per-replica pipelines, counted; a restored position skips
    the steps already taken (same topology, checked by `Position.resume_from`)."""
    for taken in range(resume.batches if resume is not None else 0):
        if next(steps, None) is None:
            raise CheckpointMismatchError(
                f"The restored iterator position is after step {resume.batches}, but these "
                f"pipelines give only {taken} steps in an epoch; restore into an iterator over "
                f"the same dataset_fn's pipelines the checkpoint was saved with."
            )
    for step in steps:
        position.produced(None)
        yield step


# --- checks and small helpers ----------------------------------------------------------------


def _options(options: Any) -> InputOptions:
    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        raise InputTypeError(
            f"options must be an nbdist InputOptions or None, got {type(options).__name__}; "
            f"build one with InputOptions(experimental_fetch_to_device=..., ...)."
        )
    return options


def _check_iterable(value: Any, expectation: str) -> None:
    kind = type(value).__name__
    if isinstance(value, (torch.Tensor, np.ndarray)):
        hint = "; a single tensor or array is not a dataset: pass [batch] for one batch"
    elif isinstance(value, (str, bytes)):
        hint = ""
    elif isinstance(value, Mapping):
        hint = "; iterating a dict yields its keys: pass [batch] for one batch of a dict"
    elif isinstance(value, Dataset) and not isinstance(value, IterableDataset):
        hint = (
            "; a map-style Dataset yields single examples, not batches: wrap it as "
            "DataLoader(dataset, batch_size=GLOBAL_BATCH_SIZE)"
        )
    elif isinstance(value, Iterable) or hasattr(type(value), "__getitem__"):
        return
    else:
        hint = ", which is not iterable"
    raise InputTypeError(f"{expectation}, got {kind}{hint}.")


def _topology(
    devices: Sequence[str],
    num_replicas_in_sync: int,
    num_workers: int,
    worker_index: int,
    *,
    global_ids: bool = True,
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Canonical local devices and their global replica ids, checked against the counts."""
    devices = canonical_devices(devices)
    total = _count("num_replicas_in_sync", num_replicas_in_sync, 1)
    workers = _count("num_workers", num_workers, 1)
    worker = _count("worker_index", worker_index, 0)
    if worker >= workers:
        raise InputError(
            f"worker_index is {worker} but num_workers is {workers}; it must be in "
            f"0..{workers - 1}."
        )
    first = worker * len(devices)
    if global_ids and first + len(devices) > total:
        raise InputError(
            f"Worker {worker} with {len(devices)} device(s) {list(devices)} holds global "
            f"replicas {first}..{first + len(devices) - 1}, but num_replicas_in_sync is "
            f"{total}; num_replicas_in_sync must count every replica of every worker "
            f"(here at least {first + len(devices)})."
        )
    return devices, tuple(range(first, first + len(devices)))


def _len(iterable: Any, what: str) -> int:
    try:
        return len(iterable)
    except TypeError:
        raise InputTypeError(
            f"This distributed dataset has no len() because {what} "
            f"({type(iterable).__name__}) has none; count the steps of an epoch instead, or "
            f"give the input a __len__."
        ) from None


def _device_scope(device: str | None) -> Callable[[], Any]:
    """A context-manager factory: the default device for tensors made inside, if any."""
    if device is None:
        return contextlib.nullcontext
    return lambda: physical_device(device)
