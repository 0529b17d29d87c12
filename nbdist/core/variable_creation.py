"""`create_distributed_variable`: what a multi-replica strategy's variable creator builds.

Checks the options, places one single-device component per device (or on the devices of
`colocate_vars_with`), and returns a `MirroredVariable` or a `SyncOnReadVariable`. Imports
core modules only.

Example:
    >>> from nbdist.core.variable_creation import create_distributed_variable
    >>> v = create_distributed_variable(None, lambda on_read: ("cpu:0", "cpu:1"), 1.0)
    >>> type(v).__name__, v.devices
    ('MirroredVariable', ('cpu:0', 'cpu:1'))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nbdist.core.distributed_variables import (
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
)
from nbdist.core.variable_base import single_variable
from nbdist.core.variable_options import (
    VariableAggregation,
    VariableSynchronization,
    colocation_devices,
    option_member,
)
from nbdist.errors import InvalidArgumentError

__all__ = ["create_distributed_variable"]


def create_distributed_variable(
    strategy: Any,
    devices_for: Callable[[bool], tuple[str, ...]],
    initial_value: Any,
    trainable: bool | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    *,
    broadcast: Callable[[list[torch.Tensor]], None] | None = None,
) -> DistributedVariable:
    """Build a `MirroredVariable` or `SyncOnReadVariable` for a multi-replica strategy.

    `devices_for(on_read)` gives the component devices; `broadcast`, when given, makes the
    mirrored components equal to the first worker's (multi-worker strategies).

    Raises:
        ValueError: `synchronization=NONE`, which a multi-replica strategy cannot keep in sync.
    """
    sync = option_member(VariableSynchronization, synchronization, "synchronization")
    agg = option_member(VariableAggregation, aggregation, "aggregation")
    name = name or "Variable"
    if sync is VariableSynchronization.NONE:
        raise InvalidArgumentError(
            f"Variable {name!r} was created with synchronization=NONE inside the scope of "
            f"{type(strategy).__name__}, which keeps a copy per replica and must keep them in "
            "sync. Use AUTO, ON_WRITE or ON_READ, or create the variable outside the scope."
        )
    if callable(initial_value):
        initial_value = initial_value()
    on_read = sync is VariableSynchronization.ON_READ
    devices = colocation_devices() or devices_for(on_read)
    trainable = (not on_read) if trainable is None else bool(trainable)
    components = [
        single_variable(
            initial_value, trainable, sync, agg, name if k == 0 else f"{name}/replica_{k}",
            dtype, device,
        )
        for k, device in enumerate(devices)
    ]  # fmt: skip
    if broadcast is not None and not on_read:
        broadcast([component.read_value_no_copy() for component in components])
    kind = SyncOnReadVariable if on_read else MirroredVariable
    return kind(
        strategy, components, tuple(devices), name=name, trainable=trainable,
        synchronization=VariableSynchronization.ON_READ if on_read
        else VariableSynchronization.ON_WRITE,
        aggregation=agg,
    )  # fmt: skip
