"""`Variable`: a single-device mutable tensor, its reads and writes and its tensor protocol.

`nd.Variable(...)` inside a multi-replica strategy's scope asks the strategy to build a
distributed variable (TF's variable creator; `_VariableMeta`); elsewhere it is this plain
variable. The write helpers here (`as_tensor`, `write_component`) serve the distributed kinds
too (`nbdist.core.distributed_variables`). Imports core modules only.

Example:
    >>> from nbdist.core.variables import Variable
    >>> Variable(2.0) + 1
    tensor(3.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from nbdist._private_api import pytree
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.values import DistributedValues, PerReplica
from nbdist.core.variable_options import (
    VariableAggregation,
    VariableSynchronization,
    checked_arguments,
    option_member,
)
from nbdist.errors import CheckpointKeyError, InvalidArgumentError

__all__ = ["Variable", "as_tensor", "single_variable", "write_component"]


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
        tensor = as_tensor(initial_value, dtype)
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


def write_component(component: Variable, value: Any, method: str) -> None:
    """Write a distributed variable's component through its own `assign`, `assign_add` or
    `assign_sub` (`method`)."""
    getattr(component, method)(value)


def as_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
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
    source = as_tensor(value).to(target.device, target.dtype)
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


Variable.__module__ = "nbdist.core.variables"  # where users import it (checkpoints name it so)
