"""Variables: `Variable`, and the distributed kinds `MirroredVariable` and `SyncOnReadVariable`.

`nd.Variable(...)` inside a multi-replica strategy's scope asks the strategy to build a
distributed variable (TF's variable creator). Every variable works as a tensor in torch
operations, reading the local component in replica context. Imports core modules only.

This module gathers the names of four that each do one job: `variable_options` (the
synchronization and aggregation options, colocation), `variable_base` (the single-device
`Variable`), `distributed_variables` (the mirrored and sync-on-read kinds) and
`variable_creation` (what a strategy's variable creator builds). Import from here.

Example:
    >>> from nbdist.core.variables import Variable, VariableAggregation
    >>> Variable(1.0, aggregation=VariableAggregation.SUM).aggregation
    <VariableAggregation.SUM: 'SUM'>
"""

from __future__ import annotations

from nbdist.core.distributed_variables import (
    DistributedVariable,  # noqa: F401  (checkpoint/workers.py and engine_side/resize.py import it here)
    MirroredVariable,
    SyncOnReadVariable,
    _rebuild_variable,  # noqa: F401  (pickles of distributed variables name it here)
)
from nbdist.core.variable_base import Variable, single_variable
from nbdist.core.variable_creation import create_distributed_variable
from nbdist.core.variable_options import (
    VariableAggregation,
    VariableSynchronization,
    checked_arguments,
    colocated_with,
    colocation_devices,
    option_member,
)

__all__ = [
    "MirroredVariable",
    "SyncOnReadVariable",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "checked_arguments",
    "colocated_with",
    "colocation_devices",
    "create_distributed_variable",
    "option_member",
    "single_variable",
]
