"""`ReduceOp`: how values from several replicas are combined. Imports only nbdist.errors."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from nbdist._lazy_module import LazyModule
from nbdist.core.names import member_by_name
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")  # imported at first use: not on `Cluster.start()`'s path

__all__ = ["ReduceOp", "as_reducible", "refuse_bool"]


class ReduceOp(enum.Enum):
    """How a set of per-replica values is combined into one.

    `SUM` and `MEAN` are TensorFlow's; `MAX` and `MIN` are beyond TF. Every nbdist API that takes
    a reduce op also takes its name, in any case.

    Example:
        >>> ReduceOp.from_value("mean")
        <ReduceOp.MEAN: 'MEAN'>
    """

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"

    # Members are singletons compared by identity, so the identity hash is consistent with
    # `==`; `Enum.__hash__` is a Python function, and every collective hashes its op a few
    # times (its layout key), which made it a measurable part of a small all-reduce.
    __hash__ = object.__hash__

    @classmethod
    def from_value(cls, value: ReduceOp | str) -> ReduceOp:
        """Return the `ReduceOp` for an op or its name (`"sum"`, `"MEAN"`, ...)."""
        if type(value) is str or type(value) is cls:  # one dict read for a value seen before
            member = RESOLVED_OPS.get(value)
            if member is not None:
                return member
        member = member_by_name(cls, value)
        if member is not None:
            if type(value) is str and len(RESOLVED_OPS) < _MAX_RESOLVED:
                RESOLVED_OPS[value] = member
            return member
        names = ", ".join(repr(op.value) for op in cls)
        raise InvalidArgumentError(
            f"Unknown reduce op {value!r}; use nbdist.ReduceOp or one of its names: {names}."
        )

    def combine(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Combine same-shaped tensors element-wise (`MEAN` of integers gives floats)."""
        if self is ReduceOp.MAX:
            return _fold(torch.maximum, tensors)
        if self is ReduceOp.MIN:
            return _fold(torch.minimum, tensors)
        if len(tensors) == 1:
            total = tensors[0].clone()
        else:
            total = torch.add(tensors[0], tensors[1])
            for other in tensors[2:]:
                total.add_(other)
        if self is ReduceOp.MEAN:
            if not (total.is_floating_point() or total.is_complex()):
                total = total.to(torch.get_default_dtype())
            return total.div_(len(tensors))
        return total

    def reduce_along(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Reduce one tensor along `dim` (the per-replica step of `Strategy.reduce(axis=k)`)."""
        if self is ReduceOp.MAX:
            return tensor.amax(dim=dim)
        if self is ReduceOp.MIN:
            return tensor.amin(dim=dim)
        return tensor.sum(dim=dim)


# Every member, and the names `from_value` has resolved (as given): a caller on a hot path
# reads its op here, when the value is a `str` or a `ReduceOp`, and calls `from_value` only on
# a miss (which also raises the error for an unknown name).
RESOLVED_OPS: dict[ReduceOp | str, ReduceOp] = {op: op for op in ReduceOp}
_MAX_RESOLVED = 64


def _fold(binary, tensors: list[torch.Tensor]) -> torch.Tensor:
    result = tensors[0]
    for other in tensors[1:]:
        result = binary(result, other)
    if len(tensors) == 1:
        result = result.clone()
    return result


def refuse_bool(op: ReduceOp, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> None:
    """Raise `ArgumentTypeError` when any of `tensors` is a bool tensor.

    Note [Bool reductions]: TensorFlow refuses to reduce bool values across replicas (its
    `add_n`, `reduce_sum` and collective kernels take numbers only), and a bool `SUM` or `MEAN`
    has no single meaning (a logical OR, or a count?). nbdist refuses them too, with the same
    error on every strategy and path (in-process and across workers, `reduce`, `all_reduce`,
    `reduce_to`, the notebook's `cluster.strategy.reduce`), before any value is combined; the
    message gives the conversion for each meaning.

    Example:
        >>> refuse_bool(ReduceOp.SUM, [torch.ones(2)])  # numbers pass
        >>> try:
        ...     refuse_bool(ReduceOp.SUM, [torch.tensor([True])])
        ... except TypeError as err:
        ...     str(err).split(":")[0]
        'Cannot reduce a bool tensor with SUM'
    """
    for tensor in tensors:
        if tensor.dtype is torch.bool:
            raise ArgumentTypeError(
                f"Cannot reduce a bool tensor with {op.value}: TensorFlow refuses bool values "
                "in cross-replica reductions, and so does nbdist. Convert it first: "
                "`t.int()` with SUM counts the True values, `t.float()` with MEAN gives the "
                "fraction that is True, and MAX/MIN of `t.int()` give any/all."
            )


def as_reducible(value: object, what: str) -> torch.Tensor:
    """`value` as a tensor for `what` (`"strategy.reduce"`, `"all_reduce"`, ...), or an
    `InvalidArgumentError` naming the leaf's type and the fix (torch's own error, "Could not
    infer dtype of NoneType", names neither).

    Example:
        >>> as_reducible(2.0, "strategy.reduce")
        tensor(2.)
        >>> try:
        ...     as_reducible(None, "strategy.reduce")
        ... except ValueError as err:
        ...     str(err).split(":")[0]
        'strategy.reduce cannot combine None (a NoneType)'
    """
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (RuntimeError, TypeError, ValueError):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InvalidArgumentError(
            f"{what} cannot combine {shown} (a {type(value).__name__}): it combines tensors "
            "and numbers, leaf by leaf. Return tensors (or numbers) from the function given "
            "to strategy.run, or pass only those parts of the result (e.g. "
            "strategy.reduce(op, result['loss']) for a dict)."
        ) from None
