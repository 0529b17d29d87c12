"""`DistributedIterator`: one epoch over a distributed dataset, and its position.

Built by `iter(DistributedDataset)` (nbdist.input.dataset). It moves each step's batches to
the replicas' devices (reading ahead on CUDA), gives them as `PerReplica` values, and counts
its position (nbdist.input.position) so that checkpoints can save and restore it. Imports
nbdist.core.values, nbdist.errors and the other nbdist.input modules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist._private_api import pytree
from nbdist.core.values import PerReplica
from nbdist.errors import CheckpointError, CheckpointTypeError
from nbdist.input.position import Position, Resume
from nbdist.input.transfer import DeviceTransfer

__all__ = ["DistributedIterator"]


class DistributedIterator:
    """One epoch over a `DistributedDataset`: each step gives every local replica its batch.

    Yields, per step, the batch structure whose leaves are `PerReplica` values (one component
    per local replica, `replica_ids` the global ids) when the worker has several replicas, else
    the plain structure. On CUDA devices the next `experimental_per_replica_buffer_size`
    batches are copied ahead while the current step runs (so leaving an epoch early with
    `break` drops them; a re-iterable input starts over anyway). An error in a batch read
    ahead is raised when that batch's turn comes.

    Example:
        >>> import torch
        >>> from nbdist.input import distribute_dataset
        >>> it = iter(distribute_dataset([torch.arange(4)], devices=("cpu:0", "cpu:1"),
        ...                              num_replicas_in_sync=2))
        >>> it.get_next()
        PerReplica:{0: tensor([0, 1]), 1: tensor([2, 3])}
    """

    def __init__(
        self,
        steps: Iterator[list[Any]],
        transfer: DeviceTransfer,
        depth: int,
        replica_ids: tuple[int, ...],
        *,
        position: Position | None = None,
        resume: Callable[[Resume], Iterator[list[Any]]] | None = None,
        origin: tuple[Any, list[torch.Tensor]] | None = None,
    ):
        self._origin = origin
        self._steps, self._transfer, self._depth = steps, transfer, depth
        self._replica_ids = replica_ids
        self._buffer: deque[Any] = deque()
        self._done = False
        self._position = position
        self._resume = resume
        self._started = False

    def __iter__(self) -> DistributedIterator:
        return self

    @property
    def position(self) -> Position | None:
        """How far the iterator has got (batches and examples delivered), which a checkpoint
        saves and restores; None for an iterator not made by `iter(distributed_dataset)`."""
        return self._position

    @property
    def origin(self) -> tuple[Any, list[torch.Tensor]] | None:
        """`(dataset, states of its loader's random generators when this epoch began)`, for
        following a resize (Note [Following a resize] in nbdist.input.following); None for an
        iterator not made by `iter(distributed_dataset)`."""
        return self._origin

    def take_over(self, other: DistributedIterator) -> None:
        """Become `other` (this epoch, continued on a resized cluster), in place, so that names
        bound to this iterator follow the resize."""
        self.__dict__.update(other.__dict__)

    def __next__(self) -> Any:
        return self.get_next()

    def get_next(self) -> Any:
        """The next step's per-replica batches.

        Raises:
            StopIteration: the epoch is over (as `next` does).
        """
        self._started = True
        while not self._done and len(self._buffer) <= self._depth:
            try:
                self._buffer.append(self._transfer.start(next(self._steps)))
            except StopIteration:
                self._done = True
            except Exception as error:  # raised in order, after the batches read before it
                self._done = True
                self._buffer.append(error)
        if not self._buffer:
            raise StopIteration
        staged = self._buffer.popleft()
        if isinstance(staged, Exception):
            raise staged
        if self._position is not None:
            self._position.delivered()
        return _per_replica(self._transfer.finish(staged), self._replica_ids)

    def state_dict(self) -> dict[str, Any]:
        """This iterator's position in its epoch, as plain numbers (for checkpoints).

        The position counts global batches and the examples in them, so an iterator over
        `experimental_distribute_dataset` can resume on another number of replicas
        (Note [Iterator position] in nbdist.input.position). `nd.checkpoint.save` calls it.

        Example:
            >>> import torch
            >>> from nbdist.input import distribute_dataset
            >>> it = iter(distribute_dataset([torch.arange(4)] * 3, devices=("cpu:0",),
            ...                              num_replicas_in_sync=1))
            >>> _ = it.get_next(); it.state_dict()["batches"], it.state_dict()["examples"]
            (1, 4)
        """
        if self._position is None:
            raise CheckpointTypeError(
                "This DistributedIterator was not made by iter(distributed_dataset), so it has "
                "no position to save; iterate a strategy's distributed dataset instead."
            )
        return self._position.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue after the position `state_dict` (from `state_dict()`), on a fresh iterator.

        The global batches already given are skipped without splitting or moving them (a
        sharded DataLoader does not even read them). Call it before the first `get_next`.

        Raises:
            CheckpointMismatchError: the position belongs to another kind of dataset, to
                another topology (`distribute_datasets_from_function`), or to an input with
                other batches (fewer of them, or other global batch sizes).
            CheckpointError: this iterator has already given batches.
        """
        if self._position is None or self._resume is None:
            self.state_dict()  # raises the error for a hand-made iterator
        assert self._position is not None and self._resume is not None
        if self._started:
            raise CheckpointError(
                "This iterator has already given batches or been restored, so it cannot move "
                "to a restored position; restore into a fresh iter(dataset) before calling "
                "next() on it."
            )
        resume = self._position.resume_from(state_dict)
        self._started = True
        self._steps = self._resume(resume)
        self._position.skipped(resume)
        try:  # skip now, so that a mismatch is raised by the restore, not by a later step
            self._buffer.append(self._transfer.start(next(self._steps)))
        except StopIteration:
            self._done = True
        except CheckpointError:
            self._done = True
            raise
        except Exception as error:  # a bad batch after the position: raised at its turn
            self._done = True
            self._buffer.append(error)


def _per_replica(parts: list[Any], replica_ids: tuple[int, ...]) -> Any:
    """The step's structure with `PerReplica` leaves; one replica gives its structure as it is.

    Tensor leaves always become `PerReplica` (even when replicas share an object); other
    leaves that are equal on every replica stay plain. The structures match (checked before).
    """
    if len(parts) == 1:
        return parts[0]
    columns = [pytree.tree_leaves(part) for part in parts]
    leaves = []
    for column in zip(*columns):
        first = column[0]
        if not isinstance(first, torch.Tensor) and all(
            type(c) is type(first) and bool(c == first) for c in column
        ):
            leaves.append(first)
        else:
            leaves.append(PerReplica(column, replica_ids=replica_ids))
    return pytree.tree_unflatten(leaves, pytree.tree_structure(parts[0]))
