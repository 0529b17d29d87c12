"""What an input or value function is told about where it runs: `InputContext`, `ValueContext`.

Imports nbdist.input.errors only.
"""

from __future__ import annotations

import operator
from typing import Any

from nbdist.input.errors import InputError, InputTypeError

__all__ = ["InputContext", "ValueContext"]


def _count(name: str, value: Any, minimum: int) -> int:
    """An int argument >= minimum (numpy and torch ints accepted), else a clear error."""
    if isinstance(value, bool):
        raise InputTypeError(f"{name} must be an int, got {value!r}.")
    try:
        value = operator.index(value)
    except TypeError:
        kind = type(value).__name__
        raise InputTypeError(f"{name} must be an int, got {kind} {value!r}.") from None
    if value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}.")
    return value


def _index(name: str, value: Any, size_name: str, size: int) -> int:
    value = _count(name, value, 0)
    if value >= size:
        raise InputError(
            f"{name} is {value} but {size_name} is {size}; it must be in 0..{size - 1}."
        )
    return value


class InputContext:
    """What an input function (`dataset_fn`) is told about the pipeline it builds.

    `distribute_datasets_from_function` passes one to `dataset_fn`: shard the data with
    `input_pipeline_id` of `num_input_pipelines`, and batch it with
    `get_per_replica_batch_size(global_batch_size)`.

    Args:
        num_input_pipelines: Number of pipelines (workers, or replicas in `PER_REPLICA` mode).
        input_pipeline_id: This pipeline's index, in `0..num_input_pipelines-1`.
        num_replicas_in_sync: Replicas of all workers taking part in each step.

    Raises:
        ValueError: a count below 1 or an id out of range.

    Example:
        >>> ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
        >>> ctx.get_per_replica_batch_size(64)
        16
        >>> print(ctx)
        nbdist.InputContext(input pipeline id 1, total: 2)
    """

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ):
        self._num_input_pipelines = _count("num_input_pipelines", num_input_pipelines, 1)
        self._input_pipeline_id = _index(
            "input_pipeline_id", input_pipeline_id, "num_input_pipelines", self._num_input_pipelines
        )
        self._num_replicas_in_sync = _count("num_replicas_in_sync", num_replicas_in_sync, 1)

    @property
    def num_input_pipelines(self) -> int:
        """Number of input pipelines (one per worker, or per replica in `PER_REPLICA` mode)."""
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This pipeline's index, in `0..num_input_pipelines-1`: use it to shard the data."""
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas of all workers taking part in each step."""
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """The batch size each replica gets: `global_batch_size // num_replicas_in_sync`.

        Raises:
            ValueError: `global_batch_size` is negative or not divisible by
                `num_replicas_in_sync`.

        Example:
            >>> InputContext(num_replicas_in_sync=2).get_per_replica_batch_size(8)
            4
        """
        size = _count("global_batch_size", global_batch_size, 0)
        replicas = self._num_replicas_in_sync
        if size % replicas:
            low, high = size // replicas * replicas, (size // replicas + 1) * replicas
            examples = f"{low} or {high}" if low else f"{high}"
            raise InputError(
                f"The global batch size {size} is not divisible by num_replicas_in_sync "
                f"{replicas}; use a multiple of {replicas} (e.g. {examples}) so every replica "
                f"gets the same per-replica batch size."
            )
        return size // replicas

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_input_pipelines}, "
            f"input_pipeline_id={self._input_pipeline_id}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )

    def __str__(self) -> str:
        return (
            f"nbdist.InputContext(input pipeline id {self._input_pipeline_id}, "
            f"total: {self._num_input_pipelines})"
        )


class ValueContext:
    """What `experimental_distribute_values_from_function` tells `value_fn` on each replica.

    Args:
        replica_id_in_sync_group: The replica's global id, in `0..num_replicas_in_sync-1`.
        num_replicas_in_sync: Replicas of all workers taking part in each step.

    Raises:
        ValueError: a count below 1 or an id out of range.

    Example:
        >>> ctx = ValueContext(replica_id_in_sync_group=1, num_replicas_in_sync=2)
        >>> ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
        (1, 2)
        >>> print(ctx)
        nbdist.ValueContext(replica id 1, total replicas in sync: 2)
    """

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1):
        self._num_replicas_in_sync = _count("num_replicas_in_sync", num_replicas_in_sync, 1)
        self._replica_id_in_sync_group = _index(
            "replica_id_in_sync_group",
            replica_id_in_sync_group,
            "num_replicas_in_sync",
            self._num_replicas_in_sync,
        )

    @property
    def replica_id_in_sync_group(self) -> int:
        """The replica's global id, in `0..num_replicas_in_sync-1`."""
        return self._replica_id_in_sync_group

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas of all workers taking part in each step."""
        return self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self._replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )

    def __str__(self) -> str:
        return (
            f"nbdist.ValueContext(replica id {self._replica_id_in_sync_group}, "
            f"total replicas in sync: {self._num_replicas_in_sync})"
        )
