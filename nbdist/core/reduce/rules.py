"""The cross-replica rules of `reduce`, `gather`, `reduce_to`, `batch_reduce_to` and `update`.

Kept apart from the strategies so every strategy applies the same TensorFlow semantics: the
`axis` denominators, plain values that count as the same on every replica, shape checks.
Imports core modules only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nbdist.core import context
from nbdist.core.reduce.cross_device import resolve_destinations
from nbdist.core.reduce.op import ReduceOp, as_reducible, refuse_bool
from nbdist.core.reduce.placement import WorkerCommunication
from nbdist.core.values import DistributedValues, Mirrored, regroup, select_replica
from nbdist.errors import ArgumentTypeError, ContextError, InvalidArgumentError

__all__ = [
    "batch_reduce_to", "check_axis_argument", "gather_value", "reduce_to", "reduce_value",
    "update",
]  # fmt: skip


def check_axis_argument(axis: Any, what: str, *, optional: bool) -> None:
    """Raise `ArgumentTypeError` unless `axis` is an int (or None when `optional`).

    A bool is refused although Python counts it as an int: `axis=True` would silently mean
    axis 1.

    Example:
        >>> check_axis_argument(0, "reduce", optional=True)
        >>> try:
        ...     check_axis_argument(True, "reduce", optional=True)
        ... except TypeError as err:
        ...     str(err).split(";")[0]
        'reduce needs an int axis or None, got True (a bool)'
    """
    if (axis is None and optional) or (isinstance(axis, int) and not isinstance(axis, bool)):
        return
    kind = "an int axis or None" if optional else "an int axis"
    got = f"{axis!r} (a bool)" if isinstance(axis, bool) else repr(axis)
    raise ArgumentTypeError(
        f"{what} needs {kind}, got {got}; pass the dimension as a number, e.g. axis=0 for "
        "the batch dimension" + (", or axis=None to reduce across replicas only." if optional
                                 else ".")
    )  # fmt: skip


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    read = getattr(value, "read_value", None)
    if read is not None and not isinstance(value, torch.Tensor):
        value = read()
    return value if isinstance(value, torch.Tensor) else as_reducible(value, what)


def _caller_device() -> torch.device:
    return torch.get_default_device()


def _components(value: Any, what: str) -> tuple[list[torch.Tensor], bool]:
    if isinstance(value, DistributedValues):
        return [_as_tensor(c, what).to(_caller_device()) for c in value.values], True
    return [_as_tensor(value, what).to(_caller_device())], False


def _check_axis(axis: int, tensors: list[torch.Tensor], what: str) -> int:
    rank = tensors[0].dim()
    if rank == 0:
        raise InvalidArgumentError(
            f"Cannot {what} along axis {axis}: the per-replica values are scalars (rank 0). "
            "Use axis=None, or give each replica a value with a batch dimension "
            "(e.g. tensor.reshape(1))."
        )
    if not -rank <= axis < rank:
        raise InvalidArgumentError(
            f"axis {axis} is out of range for per-replica values of rank {rank} (shape "
            f"{tuple(tensors[0].shape)}); use an axis in [0, {rank})."
        )
    return axis % rank


def reduce_value(strategy: WorkerCommunication, op: ReduceOp, value: Any, axis: int | None) -> Any:
    """`Strategy.reduce` for one leaf: see the docstring there.

    In a multi-worker strategy a plain value is this worker's replica's component, and the
    local result is combined across workers (`strategy.across_workers`).
    """
    check_axis_argument(axis, "reduce", optional=True)
    placement = strategy.placement
    n = placement.num_replicas_in_sync
    workers = placement.num_workers
    tensors, distributed = _components(value, "strategy.reduce")
    refuse_bool(op, tensors)  # Note [Bool reductions]
    distributed = distributed or workers > 1
    if axis is None:
        if not distributed:
            if op is ReduceOp.SUM and n > 1:
                raise InvalidArgumentError(
                    f"Cannot SUM a plain (non-distributed) value over {n} replicas with "
                    "axis=None: it is not a per-replica value, so TensorFlow and nbdist refuse "
                    "to guess. Pass the PerReplica value returned by strategy.run, or use MEAN."
                )
            return tensors[0]
        shapes = [tuple(t.shape) for t in tensors]
        if len(set(shapes)) > 1:
            ids = getattr(value, "replica_ids", range(len(shapes)))
            listed = ", ".join(f"replica {i}: {s}" for i, s in zip(ids, shapes))
            raise InvalidArgumentError(
                f"Cannot reduce per-replica values of different shapes with axis=None "
                f"({listed}). Pass axis=0 to reduce along the batch dimension too (this handles "
                "partial batches), or make every replica return the same shape."
            )
        if workers == 1:
            return op.combine(tensors)
        local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        total = strategy.across_workers(local_op, local_op.combine(tensors))
        return _mean(total, n) if op is ReduceOp.MEAN else total
    dim = _check_axis(axis, tensors, "reduce")
    if not distributed:
        if not tensors[0].shape[dim]:
            return _empty_reduction(op, tensors[0], dim)
        along = op.reduce_along(tensors[0], dim)
        if op is ReduceOp.SUM:
            return along * n
        if op is ReduceOp.MEAN:
            return _mean(tensors[0].sum(dim=dim), tensors[0].shape[dim])
        return along
    rest = {tuple(t.shape[:dim] + t.shape[dim + 1 :]) for t in tensors}
    if len(rest) > 1:
        raise InvalidArgumentError(
            f"Cannot reduce along axis {axis}: the other dimensions differ between replicas "
            f"({sorted(rest)}). Every replica must return the same shape apart from axis {axis}."
        )
    partials = [op.reduce_along(t, dim) for t in tensors if t.shape[dim] > 0]
    count = sum(t.shape[dim] for t in tensors)
    if workers > 1:
        return _reduce_along_across_workers(strategy, op, tensors[0], dim, partials, count)
    if not partials:
        return _empty_reduction(op, tensors[0], dim)
    if op is ReduceOp.MEAN:
        return _mean(ReduceOp.SUM.combine(partials), count)
    return op.combine(partials)


def _reduce_along_across_workers(
    strategy: WorkerCommunication,
    op: ReduceOp,
    like: torch.Tensor,
    dim: int,
    partials: list[torch.Tensor],
    count: int,
) -> torch.Tensor:
    template = like.sum(dim=dim)
    if op in (ReduceOp.SUM, ReduceOp.MEAN):
        local = ReduceOp.SUM.combine(partials) if partials else torch.zeros_like(template)
        total = strategy.across_workers(ReduceOp.SUM, local)
        if op is ReduceOp.SUM:
            return total
        counted = strategy.across_workers(ReduceOp.SUM, torch.tensor(float(count)))
        return (
            _mean(total, 1).div_(counted)
            if total.is_floating_point()
            else (total.to(torch.get_default_dtype()) / counted)
        )
    local = op.combine(partials) if partials else _empty_reduction(op, like, dim)
    return strategy.across_workers(op, local)


def _identity(op: ReduceOp, dtype: torch.dtype) -> float:
    """MAX's or MIN's identity in `dtype`: what TensorFlow's `reduce_max`/`reduce_min` give for
    no values (-inf/+inf for floats, the lowest/highest integer for integers)."""
    if dtype.is_floating_point:
        return -math.inf if op is ReduceOp.MAX else math.inf
    info = torch.iinfo(dtype)
    return info.min if op is ReduceOp.MAX else info.max


def _empty_reduction(op: ReduceOp, like: torch.Tensor, dim: int) -> torch.Tensor:
    """The reduction of no values along `dim` (every replica's component is empty there), as
    TensorFlow gives it: SUM 0, MEAN nan (0 / 0), MAX/MIN the op's identity (-inf/+inf)."""
    template = like.sum(dim=dim)
    if op is ReduceOp.MEAN:
        return _mean(template, 0)
    if op is ReduceOp.SUM:
        return template
    return torch.full_like(template, _identity(op, like.dtype), dtype=like.dtype)


def _mean(total: torch.Tensor, count: int) -> torch.Tensor:
    if not (total.is_floating_point() or total.is_complex()):
        total = total.to(torch.get_default_dtype())
    return total / count


def gather_value(strategy: WorkerCommunication, value: Any, axis: int) -> torch.Tensor:
    """`Strategy.gather` for one leaf (across workers too, lengths along `axis` may differ)."""
    check_axis_argument(axis, "gather", optional=False)
    placement = strategy.placement
    if not isinstance(value, DistributedValues) and placement.num_workers == 1:
        # As TensorFlow's MirroredStrategy: a value that is not distributed comes back as it is
        # (one copy, not one per replica). Across workers a plain value is this worker's
        # component, gathered as TF's CollectiveAllReduce does.
        return value
    tensors, _ = _components(value, "strategy.gather")
    dim = _check_axis(axis, tensors, "gather")
    rest = {tuple(t.shape[:dim] + t.shape[dim + 1 :]) for t in tensors}
    if len(rest) > 1:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise InvalidArgumentError(
            f"Cannot gather along axis {axis}: the replicas' shapes ({shapes}) differ in "
            f"another dimension. Only axis {axis} may differ."
        )
    local = torch.cat(tensors, dim=dim)
    if placement.num_workers > 1:
        return strategy.gather_across_workers(local, dim)
    return local


def _require_cross_replica(what: str) -> None:
    if context.current_replica_context() is not None:
        raise ContextError(
            f"{what} must be called in cross-replica context, but it was called inside "
            "strategy.run. Call it from a function given to "
            "nbdist.get_replica_context().merge_call, or use ReplicaContext.all_reduce."
        )


def reduce_to(
    strategy: WorkerCommunication,
    reduce_op: ReduceOp | str,
    value: Any,
    destinations: Any,
    options: Any,
) -> Any:
    """`StrategyExtended.reduce_to`."""
    _require_cross_replica("extended.reduce_to")
    op = ReduceOp.from_value(reduce_op)
    devices = resolve_destinations(destinations)
    ops = strategy.reduction_ops()
    return ops.reduce(op, value, devices, strategy.communication_options(options))


def batch_reduce_to(
    strategy: WorkerCommunication,
    reduce_op: ReduceOp | str,
    value_destination_pairs: Sequence[tuple[Any, Any]],
    options: Any,
) -> list[Any]:
    """`StrategyExtended.batch_reduce_to`."""
    _require_cross_replica("extended.batch_reduce_to")
    op = ReduceOp.from_value(reduce_op)
    pairs = [(value, resolve_destinations(dest)) for value, dest in value_destination_pairs]
    ops = strategy.reduction_ops()
    return ops.batch_reduce(op, pairs, strategy.communication_options(options))


def update(
    strategy: WorkerCommunication,
    var: Any,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    group: bool,
) -> Any:
    """`StrategyExtended.update`: `fn(component, *args)` on each component of `var`."""
    _require_cross_replica("extended.update")
    components = var.values if isinstance(var, DistributedValues) else (var,)
    devices = getattr(var, "devices", None) or strategy.placement.parameter_devices
    results = []
    for index, component in enumerate(components):
        local_args = select_replica(index, args, unwrap_variables=True)
        local_kwargs = select_replica(index, kwargs, unwrap_variables=True)
        results.append(fn(component, *local_args, **local_kwargs))
    if not group:
        return tuple(results)
    if len(results) == 1:
        return results[0]
    return regroup(results, devices=devices, kind=Mirrored)
