"""How a dataset is distributed: `InputReplicationMode` and `InputOptions` (TensorFlow's names).

Imports nbdist.input.errors only.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from typing import Any

from nbdist.input.errors import InputError, InputTypeError

__all__ = ["InputOptions", "InputReplicationMode"]


class InputReplicationMode(str, enum.Enum):
    """How `distribute_datasets_from_function` builds input pipelines.

    `PER_WORKER`: `dataset_fn` is called once per worker and its batches are dealt to the
    worker's replicas in turn. `PER_REPLICA`: `dataset_fn` is called once per replica and each
    replica reads its own pipeline. Any spelling case is accepted.

    Example:
        >>> InputReplicationMode("per_replica")
        <InputReplicationMode.PER_REPLICA: 'PER_REPLICA'>
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"

    @classmethod
    def _missing_(cls, value: object) -> InputReplicationMode | None:
        if isinstance(value, str):
            return cls.__members__.get(value.strip().upper())
        return None

    def __str__(self) -> str:
        return self.value


def _replication_mode(value: Any) -> InputReplicationMode:
    try:
        return InputReplicationMode(value)
    except ValueError:
        raise InputError(
            f"experimental_replication_mode must be InputReplicationMode.PER_WORKER or "
            f".PER_REPLICA (or the strings 'PER_WORKER'/'PER_REPLICA'), got {value!r}."
        ) from None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputTypeError(f"InputOptions.{name} must be True or False, got {value!r}.")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputOptions:
    """Options for `experimental_distribute_dataset` and `distribute_datasets_from_function`.

    Args:
        experimental_fetch_to_device: Move each replica's batch to the replica's device
            (prefetched ahead on CUDA devices). False leaves batches where the input made them.
            `None` means True, as in TensorFlow.
        experimental_replication_mode: `InputReplicationMode` (or its name, any case).
        experimental_place_dataset_on_device: Create the dataset on the replica's device: the
            per-replica `dataset_fn` call and its iteration run under `torch.device(device)`.
            TensorFlow allows it only with `PER_REPLICA` and `experimental_fetch_to_device=False`.
        experimental_per_replica_buffer_size: Batches prefetched ahead per replica (>= 1).

    Raises:
        ValueError: an invalid mode, buffer size or combination (checked when built).
        TypeError: a flag that is not a bool, or a buffer size that is not an int.

    Example:
        >>> InputOptions(experimental_replication_mode="per_replica").experimental_replication_mode
        <InputReplicationMode.PER_REPLICA: 'PER_REPLICA'>
    """

    experimental_fetch_to_device: bool | None = True
    experimental_replication_mode: InputReplicationMode | str = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self) -> None:
        fetch = self.experimental_fetch_to_device
        fetch = _flag("experimental_fetch_to_device", True if fetch is None else fetch)
        mode = _replication_mode(self.experimental_replication_mode)
        place = _flag(
            "experimental_place_dataset_on_device", self.experimental_place_dataset_on_device
        )
        buffer_size = self.experimental_per_replica_buffer_size
        if isinstance(buffer_size, bool):
            raise InputTypeError(
                f"experimental_per_replica_buffer_size must be an int >= 1, got {buffer_size!r}."
            )
        try:
            buffer_size = operator.index(buffer_size)
        except TypeError:
            raise InputTypeError(
                f"experimental_per_replica_buffer_size must be an int >= 1, got {buffer_size!r}."
            ) from None
        if buffer_size < 1:
            raise InputError(
                f"experimental_per_replica_buffer_size must be >= 1, got {buffer_size}; use 1 "
                f"(the default) to prefetch one batch ahead per replica."
            )
        if place and mode is InputReplicationMode.PER_WORKER:
            raise InputError(
                "experimental_place_dataset_on_device=True needs "
                "experimental_replication_mode=InputReplicationMode.PER_REPLICA, got PER_WORKER; "
                "set the mode to PER_REPLICA (with distribute_datasets_from_function) or leave "
                "experimental_place_dataset_on_device False."
            )
        if place and fetch:
            raise InputError(
                "experimental_place_dataset_on_device=True cannot be combined with "
                "experimental_fetch_to_device=True (the dataset already lives on the device); "
                "pass experimental_fetch_to_device=False as well."
            )
        object.__setattr__(self, "experimental_fetch_to_device", fetch)
        object.__setattr__(self, "experimental_replication_mode", mode)
        object.__setattr__(self, "experimental_per_replica_buffer_size", buffer_size)
