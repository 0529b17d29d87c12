"""Input: distributing datasets over replicas, as `tf.distribute` does (docs/api.md §6).

`experimental_distribute_dataset` splits global batches over the replicas
(`distribute_dataset`); `distribute_datasets_from_function` deals batches from pipelines the
user builds per worker or per replica (`InputContext`). Strategies call these with their
devices; `ValueContext` serves `experimental_distribute_values_from_function`.

Modules: `options` (InputReplicationMode, InputOptions), `contexts` (InputContext,
ValueContext), `batches` (checking and splitting one batch), `steps` (an epoch's per-replica
batches, on the host), `sharding` (a DataLoader read by index, each worker only its rows),
`transfer` (moving and prefetching to devices), `dataset` (the distributed dataset),
`iterator` (its iterator), `position` (the iterator's position, for checkpoints), `errors`.
"""

from __future__ import annotations

from nbdist.input.batches import split_batch
from nbdist.input.contexts import InputContext, ValueContext
from nbdist.input.dataset import (
    DistributedDataset,
    DistributedIterator,
    distribute_dataset,
    distribute_datasets_from_function,
)
from nbdist.input.errors import (
    InputError,
    InputExhaustedError,
    InputModeError,
    InputTransformationError,
    InputTypeError,
)
from nbdist.input.options import InputOptions, InputReplicationMode

__all__ = [
    "DistributedDataset",
    "DistributedIterator",
    "InputContext",
    "InputError",
    "InputExhaustedError",
    "InputModeError",
    "InputOptions",
    "InputReplicationMode",
    "InputTransformationError",
    "InputTypeError",
    "ValueContext",
    "distribute_dataset",
    "distribute_datasets_from_function",
    "split_batch",
]
