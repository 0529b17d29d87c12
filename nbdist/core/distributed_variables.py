"""The distributed variables: `MirroredVariable` (ON_WRITE) and `SyncOnReadVariable` (ON_READ).

A `DistributedVariable` holds one single-device `Variable` per device and reads the local
component in replica context; the two kinds differ in how writes and cross-replica reads are
aggregated. Strategies build them with `nbdist.core.variable_creation`. Imports core modules only.

Example:
    >>> from nbdist.core.variables import MirroredVariable, Variable
    >>> issubclass(MirroredVariable, Variable)
    True
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.values import DistributedValues, PerReplica, register_variable_type
from nbdist.core.variable_base import Variable, as_tensor, write_component
from nbdist.core.variable_options import VariableAggregation, VariableSynchronization
from nbdist.errors import InvalidArgumentError

__all__ = ["DistributedVariable", "MirroredVariable", "SyncOnReadVariable"]


@register_variable_type
class DistributedVariable(DistributedValues, Variable):
    """A variable with one component (a single-device `Variable`) per device."""

    def __init__(
        self,
        strategy: Any,
        components: list[Variable],
        devices: tuple[str, ...],
        *,
        name: str,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
    ):
        DistributedValues.__init__(self, components, devices=devices)
        self._strategy = strategy
        self._name = name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._device = devices[0]

    def __reduce__(self):
        # A copy for a process that joins a resized cluster (`%dist scale`): the strategy is
        # pickled as a reference there and becomes that process's strategy.
        return (
            _rebuild_variable,
            (type(self), self._strategy, list(self._values), self._devices, self._name,
             self._trainable, self._synchronization, self._aggregation),
        )  # fmt: skip

    @property
    def devices(self) -> tuple[str, ...]:  # type: ignore[override]
        """Every device holding a component."""
        return self._devices or ()

    @property
    def distribute_strategy(self) -> Any:
        """The strategy that created the variable (as TF's `DistributedVariable`)."""
        return self._strategy

    @property
    def primary(self) -> Variable:
        """The first component."""
        return self._values[0]

    def _component_for_replica(self) -> Variable | None:
        replica = context.current_replica_context()
        if replica is None or replica.strategy is not self._strategy:
            return None
        index = replica.local_replica_index
        return self._values[index] if index < len(self._values) else self._values[0]

    def __repr__(self) -> str:
        inner = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{inner}\n}}"

    def _replica_device(self) -> torch.device | None:
        replica = context.current_replica_context()
        if replica is None:
            return None
        return physical_device(replica.devices[0])


def _rebuild_variable(cls, strategy, components, devices, name, trainable, sync, aggregation):
    """A `DistributedVariable` from its pickled parts (`DistributedVariable.__reduce__`)."""
    return cls(
        strategy, components, devices, name=name, trainable=trainable,
        synchronization=sync, aggregation=aggregation,
    )  # fmt: skip


class MirroredVariable(DistributedVariable):
    """A variable kept identical on every device (`synchronization=ON_WRITE`).

    Cross-replica writes go to every component (a `PerReplica` value is refused); replica
    writes are aggregated with the variable's `aggregation` first, so the copies never diverge.
    """

    def _read(self) -> torch.Tensor:
        component = self._component_for_replica()
        if component is None:
            return self.primary.read_value_no_copy()
        tensor = component.read_value_no_copy()
        device = self._replica_device()
        return tensor if device is None or tensor.device == device else tensor.to(device)

    def _write(self, value: Any, method: str) -> Variable:
        if context.current_replica_context() is None:
            if isinstance(value, PerReplica):
                raise InvalidArgumentError(
                    f"Cannot {method} a PerReplica value to MirroredVariable {self._name!r} in "
                    "cross-replica context: its copies would diverge. Reduce the value first "
                    "(strategy.reduce or extended.reduce_to) or assign inside strategy.run with "
                    "an aggregation set on the variable."
                )
            if isinstance(value, DistributedValues):
                value = value.values[0]
            for component in self._values:
                write_component(component, value, method)
            return self
        if self._aggregation is VariableAggregation.NONE:
            raise InvalidArgumentError(
                f"MirroredVariable {self._name!r} has aggregation NONE, so a {method} inside "
                "strategy.run would make its copies diverge. Create it with an aggregation, e.g. "
                "nd.Variable(..., aggregation=nd.VariableAggregation.MEAN), or write it in "
                "cross-replica context."
            )
        replica = context.current_replica_context()
        aggregation = self._aggregation
        variable = self

        def merge(strategy: Any, per_replica: Any) -> None:
            if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
                first = (
                    per_replica.values[0] if isinstance(per_replica, PerReplica) else per_replica
                )
                merged = strategy.extended.broadcast_from_first(as_tensor(first))
            elif isinstance(per_replica, PerReplica) or strategy.extended.placement.num_workers > 1:
                op = ReduceOp.SUM if aggregation is VariableAggregation.SUM else ReduceOp.MEAN
                merged = strategy.reduce(op, per_replica, axis=None)
            else:
                op = ReduceOp.SUM if aggregation is VariableAggregation.SUM else ReduceOp.MEAN
                merged = _same_value_aggregate(op, per_replica, strategy.num_replicas_in_sync)
            for component in variable.values:
                write_component(component, merged, method)

        replica.merge_call(merge, args=(as_tensor(value),))
        return self

    def _restore(self, value: Any) -> None:
        component = self._component_for_replica()
        if component is None:
            self._write(value, "assign")
        else:  # every replica restores its own copy of the same checkpoint
            component.assign(value)


def _same_value_aggregate(op: ReduceOp, value: Any, replicas: int) -> torch.Tensor:
    tensor = as_tensor(value)
    return tensor * replicas if op is ReduceOp.SUM else tensor


class SyncOnReadVariable(DistributedVariable):
    """A variable each replica writes locally, aggregated when read in cross-replica context.

    Used for metrics and batch-norm statistics: no communication until it is read.
    """

    def _read(self) -> torch.Tensor:
        component = self._component_for_replica()
        if component is not None:
            return component.read_value_no_copy()
        return self._aggregate()

    def _aggregate(self) -> torch.Tensor:
        aggregation = self._aggregation
        strategy = self._strategy
        if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            return strategy.extended.broadcast_from_first(self.primary.read_value_no_copy())
        if aggregation is VariableAggregation.NONE:
            raise InvalidArgumentError(
                f"SyncOnReadVariable {self._name!r} has aggregation NONE, so it has no "
                "cross-replica value. Read it inside strategy.run, or create it with "
                "aggregation SUM, MEAN or ONLY_FIRST_REPLICA."
            )
        device = self.primary.read_value_no_copy().device
        tensors = [c.read_value_no_copy().to(device) for c in self._values]
        total = strategy.extended.across_workers(ReduceOp.SUM, ReduceOp.SUM.combine(tensors))
        if aggregation is VariableAggregation.SUM:
            return total
        if not total.is_floating_point():
            total = total.to(torch.get_default_dtype())
        return total / strategy.num_replicas_in_sync

    def _write(self, value: Any, method: str) -> Variable:
        component = self._component_for_replica()
        if component is not None:
            write_component(component, value, method)
            return self
        if isinstance(value, PerReplica):
            raise InvalidArgumentError(
                f"Cannot {method} a PerReplica value to SyncOnReadVariable {self._name!r} in "
                "cross-replica context; assign inside strategy.run to write each replica's "
                "component."
            )
        if self._aggregation is VariableAggregation.SUM:
            if method != "assign":
                raise InvalidArgumentError(
                    f"SyncOnReadVariable {self._name!r} with aggregation SUM does not support "
                    f"{method} in cross-replica context (as in TensorFlow): the increment would "
                    "be counted once per replica. Use assign, or do it inside strategy.run."
                )
            ids = self._strategy.extended.placement.local_replica_ids
            for replica_id, component in zip(ids, self._values):
                write_component(component, self._sum_share(value, replica_id), method)
            return self
        for component in self._values:
            write_component(component, value, method)
        return self

    def _sum_share(self, value: Any, replica_id: int) -> torch.Tensor:
        """Replica `replica_id`'s share of the SUM aggregate `value`, so that the shares add up
        to `value` exactly: a floating value is divided evenly (as TensorFlow does); an
        integer one is split as `value // n` each, plus the remainder on replica 0 (an even
        split, rounded, lost the remainder: 9 over 2 replicas read back 8)."""
        n = self._strategy.num_replicas_in_sync
        dtype = self.primary.dtype
        tensor = as_tensor(value)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            return tensor / n
        tensor = tensor.to(dtype)
        share = torch.div(tensor, n, rounding_mode="floor")
        return share + (tensor - share * n) if replica_id == 0 else share

    def _restore(self, value: Any) -> None:
        component = self._component_for_replica()
        if component is None:
            self._write(value, "assign")
            return
        if self._aggregation is VariableAggregation.SUM:
            replica = context.current_replica_context()
            replica_id = replica.replica_id_in_sync_group if replica is not None else 0
            value = self._sum_share(value, replica_id)
        component.assign(value)

    def _checkpoint_value(self) -> torch.Tensor:
        replica = context.current_replica_context()
        if replica is None or replica.strategy is not self._strategy:
            return self._aggregate()
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            return replica.all_gather(self._read().unsqueeze(0), axis=0)[0]
        op = "SUM" if self._aggregation is VariableAggregation.SUM else "MEAN"
        return replica.all_reduce(op, self._read())


# Users import these from nbdist.core.variables: checkpoints record a variable's type by
# `__module__`, and pickles name the class (and `_rebuild_variable`) there.
for _kind in (DistributedVariable, MirroredVariable, SyncOnReadVariable):
    _kind.__module__ = "nbdist.core.variables"
_rebuild_variable.__module__ = "nbdist.core.variables"
