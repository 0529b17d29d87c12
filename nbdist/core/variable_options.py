"""The options of a variable: when its components synchronise (`VariableSynchronization`),
how replicas' values combine (`VariableAggregation`), which `nd.Variable` arguments are accepted
(`checked_arguments`), and where `colocate_vars_with` puts new variables (`colocated_with`).

Kept apart from `nbdist.core.variables` (which re-exports every name here) so that code that only
names an option needs no variable machinery. Imports core modules only.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterator
from typing import Any

from nbdist.core.names import member_by_name
from nbdist.errors import InvalidArgumentError

__all__ = [
    "VariableAggregation",
    "VariableSynchronization",
    "checked_arguments",
    "colocated_with",
    "colocation_devices",
    "option_member",
]


class VariableSynchronization(enum.Enum):
    """When a distributed variable's components are synchronised (TF's names)."""

    AUTO = "AUTO"
    NONE = "NONE"
    ON_WRITE = "ON_WRITE"
    ON_READ = "ON_READ"


class VariableAggregation(enum.Enum):
    """How replicas' writes (mirrored) or components (sync-on-read) are combined."""

    NONE = "NONE"
    SUM = "SUM"
    MEAN = "MEAN"
    ONLY_FIRST_REPLICA = "ONLY_FIRST_REPLICA"


def option_member(cls: type[enum.Enum], value: Any, what: str) -> Any:
    """The member of `cls` that `value` names (a member, or its name in any case); an error
    naming the choices otherwise.

    Example:
        >>> option_member(VariableAggregation, "mean", "aggregation")
        <VariableAggregation.MEAN: 'MEAN'>
    """
    member = member_by_name(cls, value)
    if member is not None:
        return member
    raise InvalidArgumentError(f"Unknown {what} {value!r}; choose one of {[m.name for m in cls]}.")


_colocate_devices: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "nbdist_colocate_devices", default=None
)


@contextlib.contextmanager
def colocated_with(variable: Any) -> Iterator[None]:
    """Variables created inside land on the devices of `variable` (`colocate_vars_with`)."""
    devices = getattr(variable, "devices", None)
    if not devices:
        raise InvalidArgumentError(
            f"colocate_vars_with needs a variable created in strategy.scope(), got {variable!r}."
        )
    token = _colocate_devices.set(tuple(devices))
    try:
        yield
    finally:
        _colocate_devices.reset(token)


def colocation_devices() -> tuple[str, ...] | None:
    """The devices set by an active `colocate_vars_with`, if any."""
    return _colocate_devices.get()


_ACCEPTED = ("initial_value", "trainable", "synchronization", "aggregation", "name", "dtype")
# TensorFlow's other `tf.Variable` arguments: accepted only at the value that changes nothing.
_TF_ONLY = {
    "validate_shape": (True, "variables take the shape of their initial value"),
    "shape": (None, "variables take the shape of their initial value"),
    "caching_device": (None, "there is no variable caching"),
    "constraint": (None, "apply the constraint after the optimizer step instead"),
    "variable_def": (None, "there are no graph protos"),
    "import_scope": (None, "there are no graph protos"),
    "experimental_enable_variable_lifting": (True, "there is no graph to lift from"),
}


def checked_arguments(kwargs: dict[str, Any], in_strategy: bool) -> dict[str, Any]:
    """`kwargs` of `nd.Variable(...)` without TensorFlow's no-op arguments; any other argument
    nbdist does not support is refused by name (never swallowed).

    Example:
        >>> checked_arguments({"name": "w", "validate_shape": True}, in_strategy=False)
        {'name': 'w'}
    """
    from nbdist.errors import UnknownArgumentError, UnsupportedOptionError

    out = {}
    for key, value in kwargs.items():
        if key in _ACCEPTED or (key == "device" and not in_strategy):
            out[key] = value
        elif key == "device":
            raise UnsupportedOptionError(
                f"nd.Variable got device={value!r} inside a strategy's scope, where the "
                "strategy places variables. Remove device=, use "
                "strategy.extended.colocate_vars_with(other_variable), or create the variable "
                "outside the scope."
            )
        elif key in _TF_ONLY:
            no_op, why = _TF_ONLY[key]
            if value is no_op or (isinstance(no_op, bool) and value == no_op):
                continue
            raise UnsupportedOptionError(
                f"nd.Variable got {key}={value!r}, a TensorFlow argument nbdist does not "
                f"support ({why}). Remove {key}=."
            )
        else:
            accepted = ", ".join([*_ACCEPTED, "device"])
            raise UnknownArgumentError(
                f"nd.Variable got an unexpected argument {key!r}. It accepts: {accepted}."
            )
    return out
