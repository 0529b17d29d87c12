"""Variables: `Variable`, and the distributed kinds `MirroredVariable` and `SyncOnReadVariable`.

`nd.Variable(...)` inside a multi-replica strategy's scope asks the strategy to build a
distributed variable (TF's variable creator). Every variable works as a tensor in torch
operations, reading the local component in replica context. Imports core modules only.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from nbdist._private_api import pytree
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.values import DistributedValues, PerReplica, register_variable_type
from nbdist.core.variable_options import (
    VariableAggregation,
    VariableSynchronization,
    checked_arguments,
    colocated_with,
    colocation_devices,
    option_member,
)
from nbdist.errors import CheckpointKeyError, InvalidArgumentError

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


class _VariableMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Variable:
            strategy = context.current_scope_strategy()
            kwargs = checked_arguments(kwargs, in_strategy=strategy is not None)
            if strategy is not None:
                return strategy.extended.create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Variable(metaclass=_VariableMeta):
    """A mutable tensor that a strategy can place and keep in sync (TF's `tf.Variable`).

    Outside any scope (and in the default or a `OneDeviceStrategy`'s scope) this is a plain
    single-device variable; in a multi-replica strategy's scope the strategy returns a
    `MirroredVariable` or `SyncOnReadVariable`.

    Example:
        >>> v = Variable(1.0)
        >>> v.assign_add(2.0)
        <nbdist.Variable 'Variable' shape=() dtype=torch.float32, value=3.0>
        >>> v * 2
        tensor(6.)
    """

    def __init__(
        self,
        initial_value: Any,
        trainable: bool | None = None,
        synchronization: VariableSynchronization | str = VariableSynchronization.AUTO,
        aggregation: VariableAggregation | str = VariableAggregation.NONE,
        name: str | None = None,
        dtype: torch.dtype | None = None,
        device: str | None = None,
    ):
        sync = option_member(VariableSynchronization, synchronization, "synchronization")
        self._synchronization = sync
        self._aggregation = option_member(VariableAggregation, aggregation, "aggregation")
        self._trainable = (
            (sync is not VariableSynchronization.ON_READ)
            if trainable is None
            else (bool(trainable))
        )
        self._name = name or "Variable"
        if callable(initial_value):
            initial_value = initial_value()
        tensor = _as_tensor(initial_value, dtype)
        self._device = device or _device_name(tensor.device)
        self._tensor = tensor.detach().to(physical_device(self._device)).clone()

    # -- reading --------------------------------------------------------------------------
    def value(self) -> torch.Tensor:
        """The current value (the local component in replica context), as a snapshot."""
        return self._read().clone()

    def read_value(self) -> torch.Tensor:
        """The current value, as a new tensor."""
        return self._read().clone()

    def numpy(self) -> Any:
        """The value as a numpy array."""
        return self._read().detach().cpu().clone().numpy()

    def read_value_no_copy(self) -> torch.Tensor:
        """The current value without a copy: the tensor the variable reads (its own, or the
        local component's in replica context), so a later write to the variable shows in it.
        For code that only reads it at once (the strategies, the tensor protocol)."""
        return self._read()

    def _read(self) -> torch.Tensor:
        return self._tensor

    # -- writing --------------------------------------------------------------------------
    def assign(self, value: Any, use_locking: bool = False, name: str | None = None) -> Variable:
        """Write `value`; returns the variable."""
        return self._write(value, "assign")

    def assign_add(
        self, delta: Any, use_locking: bool = False, name: str | None = None
    ) -> Variable:
        """Add `delta`; returns the variable."""
        return self._write(delta, "assign_add")

    def assign_sub(
        self, delta: Any, use_locking: bool = False, name: str | None = None
    ) -> Variable:
        """Subtract `delta`; returns the variable."""
        return self._write(delta, "assign_sub")

    def _write(self, value: Any, method: str) -> Variable:
        _apply(self._tensor, value, method)
        return self

    # -- attributes -----------------------------------------------------------------------
    @property
    def device(self) -> str:
        """The device of the variable (of its primary component when distributed)."""
        return self._device

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device holding a component."""
        return (self._device,)

    @property
    def dtype(self) -> torch.dtype:
        """The element type."""
        return self._read().dtype

    @property
    def shape(self) -> torch.Size:
        """The shape."""
        return self._read().shape

    @property
    def name(self) -> str:
        """The name given at creation."""
        return self._name

    @property
    def trainable(self) -> bool:
        """Whether optimizers should train it."""
        return self._trainable

    @property
    def aggregation(self) -> VariableAggregation:
        """How replicas' writes are aggregated."""
        return self._aggregation

    @property
    def synchronization(self) -> VariableSynchronization:
        """When components are synchronised."""
        return self._synchronization

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The value for a checkpoint (`{"value": tensor}`)."""
        return {"value": self._checkpoint_value().detach().clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from `state_dict()` output."""
        if "value" not in state_dict:
            raise CheckpointKeyError(
                f"A variable state dict has one key, 'value'; got {list(state_dict)}. Pass what "
                "the variable's state_dict() returned, or restore with nd.checkpoint.restore."
            )
        self._restore(state_dict["value"])

    def _checkpoint_value(self) -> torch.Tensor:
        return self._read()

    def _restore(self, value: Any) -> None:
        self.assign(value)

    # -- tensor protocol ------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map_only(Variable, _read_leaf, (args, kwargs or {}))
        return func(*args, **kwargs)

    def __array__(self, *args, **kwargs):
        return self.numpy().__array__(*args, **kwargs)

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __bool__(self) -> bool:
        return bool(self._read())

    def __repr__(self) -> str:
        value = self._read()
        shown = value.tolist() if value.numel() <= 8 else "..."
        return (
            f"<nbdist.Variable {self._name!r} shape={tuple(value.shape)} dtype={value.dtype}, "
            f"value={shown}>"
        )


def _read_leaf(variable: Variable) -> torch.Tensor:
    return variable.read_value_no_copy()


def _write_component(component: Variable, value: Any, method: str) -> None:
    """Write a distributed variable's component through its own `assign`, `assign_add` or
    `assign_sub` (`method`)."""
    getattr(component, method)(value)


def _as_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(value, (Variable, DistributedValues)):
        value = value.read_value_no_copy() if isinstance(value, Variable) else value.values[0]
        value = torch.as_tensor(value)
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if dtype is not None:
        tensor = tensor.to(dtype)
    elif not isinstance(value, torch.Tensor) and tensor.dtype == torch.float64:
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


def _device_name(device: torch.device) -> str:
    return f"{device.type}:{device.index or 0}"


def _apply(target: torch.Tensor, value: Any, method: str) -> None:
    if isinstance(value, PerReplica):
        raise InvalidArgumentError(
            "Cannot write a PerReplica value to one variable component. Reduce it first "
            "(strategy.reduce or extended.reduce_to)."
        )
    source = _as_tensor(value).to(target.device, target.dtype)
    compatible = source.shape == target.shape or (
        method != "assign" and torch.broadcast_shapes(source.shape, target.shape) == target.shape
        if _broadcastable(source.shape, target.shape)
        else False
    )
    if not compatible:
        raise InvalidArgumentError(
            f"Cannot {method} a value of shape {tuple(source.shape)} to a variable of shape "
            f"{tuple(target.shape)}: assign needs equal shapes (as in TensorFlow) and "
            "assign_add/assign_sub a delta that broadcasts to the variable's shape. Reshape the "
            "value, or create a new variable for the new shape."
        )
    with torch.no_grad():
        if method == "assign":
            target.copy_(source)
        elif method == "assign_add":
            target.add_(source)
        else:
            target.sub_(source)


def _broadcastable(a: torch.Size, b: torch.Size) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


_BINARY = (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lt", "le", "gt", "ge",
)  # fmt: skip


def _delegate(op: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self, *other):
        value = self._read()
        return op(other[0], value) if reflected else op(value, *other)

    return method


for _name in _BINARY:
    _op = getattr(operator, _name)
    setattr(Variable, f"__{_name}__", _delegate(_op))
    if _name not in ("lt", "le", "gt", "ge"):
        setattr(Variable, f"__r{_name}__", _delegate(_op, reflected=True))
for _name in ("neg", "pos", "abs"):
    setattr(Variable, f"__{_name}__", _delegate(getattr(operator, _name)))
Variable.__getitem__ = _delegate(operator.getitem)


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
                _write_component(component, value, method)
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
                merged = strategy.extended.broadcast_from_first(_as_tensor(first))
            elif isinstance(per_replica, PerReplica) or strategy.extended.placement.num_workers > 1:
                op = ReduceOp.SUM if aggregation is VariableAggregation.SUM else ReduceOp.MEAN
                merged = strategy.reduce(op, per_replica, axis=None)
            else:
                op = ReduceOp.SUM if aggregation is VariableAggregation.SUM else ReduceOp.MEAN
                merged = _same_value_aggregate(op, per_replica, strategy.num_replicas_in_sync)
            for component in variable.values:
                _write_component(component, merged, method)

        replica.merge_call(merge, args=(_as_tensor(value),))
        return self

    def _restore(self, value: Any) -> None:
        component = self._component_for_replica()
        if component is None:
            self._write(value, "assign")
        else:  # every replica restores its own copy of the same checkpoint
            component.assign(value)


def _same_value_aggregate(op: ReduceOp, value: Any, replicas: int) -> torch.Tensor:
    tensor = _as_tensor(value)
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
            _write_component(component, value, method)
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
                _write_component(component, self._sum_share(value, replica_id), method)
            return self
        for component in self._values:
            _write_component(component, value, method)
        return self

    def _sum_share(self, value: Any, replica_id: int) -> torch.Tensor:
        """Replica `replica_id`'s share of the SUM aggregate `value`, so that the shares add up
        to `value` exactly: a floating value is divided evenly (as TensorFlow does); an
        integer one is split as `value // n` each, plus the remainder on replica 0 (an even
        split, rounded, lost the remainder: 9 over 2 replicas read back 8)."""
        n = self._strategy.num_replicas_in_sync
        dtype = self.primary.dtype
        tensor = _as_tensor(value)
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


def single_variable(
    initial_value: Any,
    trainable: bool | None,
    synchronization: VariableSynchronization,
    aggregation: VariableAggregation,
    name: str,
    dtype: torch.dtype | None,
    device: str,
) -> Variable:
    """A plain single-device `Variable`, bypassing the strategy's variable creator."""
    variable = Variable.__new__(Variable)
    variable.__init__(
        initial_value, trainable=trainable, synchronization=synchronization,
        aggregation=aggregation, name=name, dtype=dtype, device=device,
    )  # fmt: skip
    return variable


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
