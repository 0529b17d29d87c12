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

from typing import TYPE_CHECKING, Any

from nbdist.core.lazy import import_lazily

if TYPE_CHECKING:
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

# Each public name's module, imported at the name's first use (Note [Lazy public API] in
# `nbdist`): `from nbdist.input.errors import ...` then costs no torch (the notebook's
# `Cluster.start()` imports the errors, not the datasets).
_LAZY = {
    "split_batch": "nbdist.input.batches",
    "InputContext": "nbdist.input.contexts",
    "ValueContext": "nbdist.input.contexts",
    "DistributedDataset": "nbdist.input.dataset",
    "DistributedIterator": "nbdist.input.dataset",
    "distribute_dataset": "nbdist.input.dataset",
    "distribute_datasets_from_function": "nbdist.input.dataset",
    "InputError": "nbdist.input.errors",
    "InputExhaustedError": "nbdist.input.errors",
    "InputModeError": "nbdist.input.errors",
    "InputTransformationError": "nbdist.input.errors",
    "InputTypeError": "nbdist.input.errors",
    "InputOptions": "nbdist.input.options",
    "InputReplicationMode": "nbdist.input.options",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    return import_lazily(__name__, globals(), _LAZY, name, submodules=True)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
