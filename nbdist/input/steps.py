"""Producing the steps of an epoch: per step, one batch structure per local replica, on the host.

`split_steps` splits global batches (`distribute_dataset`); `per_worker_steps` and
`per_replica_steps` deal batches from pipelines built by `dataset_fn`. `Epochs` re-iterates
the user's iterable once per epoch. Imports nbdist.input.batches and nbdist.input.errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from nbdist._private_api import pytree
from nbdist.input.batches import Batch, empty_like, split_batch, warn_if_empty
from nbdist.input.errors import InputError, InputExhaustedError
from nbdist.input.position import Position, Resume, skip_global_batches

__all__ = ["ACCEPTED", "Epochs", "per_replica_steps", "per_worker_steps", "split_steps"]

ACCEPTED = "a torch.utils.data.DataLoader, a list of batches, or any iterable of batches"
_END = object()


def split_steps(
    source: Epochs,
    replica_ids: tuple[int, ...],
    total: int,
    *,
    position: Position | None = None,
    resume: Resume | None = None,
) -> Iterator[list]:
    """Split each global batch over `total` replicas and keep the slices of `replica_ids`.

    `position` hears of each step's global examples; `resume` skips the global batches a
    restored iterator already gave (Note [Iterator position] in nbdist.input.position).

    Example:
        >>> import torch
        >>> next(split_steps(Epochs([torch.arange(7)], "data"), (0, 1), 2))
        [tensor([0, 1, 2, 3]), tensor([4, 5, 6])]
    """
    batches = source.epoch()
    start = 0
    if resume is not None and resume.batches:
        skip_global_batches(batches, resume, lambda s: _rows(s, "A skipped batch of the dataset"))
        start = resume.batches
    for index, structure in enumerate(batches, start=start):
        batch = Batch.of(structure, where=f"Batch {index} of the dataset")
        if position is not None:
            position.produced(batch.rows)
        if batch.rows is None:
            yield [batch.whole()] * len(replica_ids)
            continue
        bounds = split_batch(batch.rows, total)
        warn_if_empty(bounds, f"Batch {index} of the dataset")
        yield [batch.take(*bounds[replica]) for replica in replica_ids]


def _rows(structure: Any, where: str) -> int | None:
    return Batch.of(structure, where=where).rows


def per_worker_steps(source: Epochs, count: int, name: str) -> Iterator[list]:
    """Deal `count` batches per step from one pipeline; ends when replica 0 gets none.

    Example:
        >>> import torch
        >>> list(per_worker_steps(Epochs([torch.ones(1), torch.zeros(1)] * 2, "data"), 3, "fn"))
        [[tensor([1.]), tensor([0.]), tensor([1.])], [tensor([0.]), tensor([]), tensor([])]]
    """
    batches, index = source.epoch(), 0
    while True:
        parts: list[Batch | None] = []
        for _ in range(count):
            try:
                structure = next(batches)
            except StopIteration:
                break
            parts.append(Batch.of(structure, where=f"Batch {index} returned by {name}"))
            index += 1
        if not parts:
            return
        yield _fill_empty(parts + [None] * (count - len(parts)), name)
        if len(parts) < count:
            return


def per_replica_steps(
    sources: list[Epochs], scopes: list[Callable[[], Any]], name: str
) -> Iterator[list]:
    """One batch per replica from its own pipeline; ends when no replica has data left.

    `scopes[j]()` is entered around replica `j`'s reads (its default device, or nothing).

    Example:
        >>> import contextlib, torch
        >>> pipelines = [Epochs([torch.ones(1)] * 2, "a"), Epochs([torch.zeros(1)], "b")]
        >>> list(per_replica_steps(pipelines, [contextlib.nullcontext] * 2, "fn"))
        [[tensor([1.]), tensor([0.])], [tensor([1.]), tensor([])]]
    """
    pipelines = []
    for source, scope in zip(sources, scopes):
        with scope():
            pipelines.append(source.epoch())
    live, index = [True] * len(pipelines), 0
    while True:
        parts: list[Batch | None] = []
        for replica, (pipeline, scope) in enumerate(zip(pipelines, scopes)):
            structure = _END
            if live[replica]:
                with scope():
                    structure = next(pipeline, _END)
                live[replica] = structure is not _END
            where = f"Batch {index} returned by {name} for local replica {replica}"
            parts.append(None if structure is _END else Batch.of(structure, where=where))
        if not any(live):
            return
        yield _fill_empty(parts, name)
        index += 1


def _fill_empty(parts: list[Batch | None], name: str) -> list[Any]:
    """Each replica's structure; replicas without data get an empty batch like the last read."""
    last = [p for p in parts if p is not None][-1]
    for replica, part in enumerate(parts):
        if part is not None and part.spec != last.spec:
            raise InputError(
                f"{name} gave local replica {replica} a batch structured as "
                f"{_shape(part)} but another replica one structured as {_shape(last)} in the "
                f"same step; make every batch the same nested structure."
            )
    return [empty_like(last) if p is None else p.whole() for p in parts]


def _shape(batch: Batch) -> str:
    return repr(pytree.tree_unflatten([type(x).__name__ for x in batch.leaves], batch.spec))


class Epochs:
    """The user's iterable, iterated anew per epoch; a spent one-shot iterator is an error.

    A re-iterable (a list, a DataLoader) gives a fresh iterator per epoch. A one-shot iterator
    (`iter(x) is x`, e.g. a generator object) is consumed across epochs: an epoch that finds
    it spent by an earlier one raises `InputExhaustedError` (a `RuntimeError`) rather than
    silently yielding nothing. An epoch cut short (`break`) leaves it where it stopped.

    Example:
        >>> epochs = Epochs(iter([1, 2]), "data")
        >>> list(epochs.epoch()), list(epochs.epoch())
        Traceback (most recent call last):
        ...
        nbdist.input.errors.InputExhaustedError: data is a one-shot iterator ...
    """

    def __init__(self, iterable: Any, what: str):
        self._iterable, self._what, self._spent = iterable, what, False

    def epoch(self) -> Iterator[Any]:
        iterator = iter(self._iterable)
        return iterator if iterator is not self._iterable else self._one_shot(iterator)

    def _one_shot(self, iterator: Iterator[Any]) -> Iterator[Any]:
        empty = True
        for item in iterator:
            empty = False
            yield item
        if empty and self._spent:
            raise InputExhaustedError(
                f"{self._what} is a one-shot iterator ({type(self._iterable).__name__}) that a "
                f"previous epoch used up, so this epoch would be empty; pass a re-iterable "
                f"instead ({ACCEPTED} whose __iter__ starts over), e.g. a list or a class whose "
                f"__iter__ calls your generator function."
            )
        self._spent = True
