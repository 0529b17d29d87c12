"""TensorFlow's loss scaling for custom training loops: `compute_average_loss` and
`scale_regularization_loss`, under nbdist's gradient *averaging*.

Note [Averaged, not summed]: TensorFlow sums the replicas' gradients, so its recipe divides
each replica's summed per-example loss by the *global* batch size (and a regularisation loss
by the replica count): the sum over N replicas is then the gradient of the global-batch mean.
nbdist averages gradients (as DDP does), which would turn that same recipe into 1/N of the
one-device gradient. So these functions return TensorFlow's *value* (what the tutorial
prints and `strategy.reduce("sum", ...)` adds up) while their *gradient* is N times that
value's gradient; after nbdist divides by N, the step is the one-device step on the global
batch. Worked example, 2 replicas, 4 examples of loss l_1..l_4, 2 per replica: replica 0
returns (l_1 + l_2) / 4 (TF's value), its backward gives 2 * (g_1 + g_2) / 4, the average
over both replicas is (g_1 + g_2 + g_3 + g_4) / 4, the gradient of the mean of 4 on one device.

N is the replica count of the replica context (TF's `_get_num_replicas_in_sync`): inside
`strategy.run` the strategy's `num_replicas_in_sync`; in cross-replica context (allowed only
with `global_batch_size`) the current strategy's; outside every scope 1, so on one device the
functions are plain averages.

Note [Outside run]: on engines and under torchrun, nbdist also averages the gradients of a
backward made outside `strategy.run` (the DDP-style step at the top of a `%%distribute` cell
or a script), where TF's context rules say N = 1. With `global_batch_size=None` that is still
right: each worker's loss is its own batch's mean, and the average of the workers' gradients is
the global mean's. With `global_batch_size` given, each worker's loss is its share of the global
mean, so its gradient is scaled by the number of workers the averaging runs over (the process's
`MultiWorkerMirroredStrategy`), as inside `run`. The value stays TensorFlow's either way.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import torch

from nbdist.core import context
from nbdist.errors import ArgumentTypeError, ContextError, InvalidArgumentError, NbdistWarning
from nbdist.strategies.current import (
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from nbdist.strategies.multi_worker import live_multi_worker_strategy

__all__ = ["compute_average_loss", "scale_regularization_loss"]


class _ScaleGradient(torch.autograd.Function):
    """The identity forward; the gradient multiplied by `factor` backward."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, factor: int) -> torch.Tensor:
        ctx.factor = factor
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def _scale_gradient(value: torch.Tensor, factor: int) -> torch.Tensor:
    """`value`, whose gradient is `factor` times its own (Note [Averaged, not summed])."""
    if factor == 1 or not value.requires_grad:
        return value
    return _ScaleGradient.apply(value, factor)


def _replicas_in_sync() -> int:
    """The replica count, as TensorFlow finds it: the replica context's, else the current
    strategy's, else 1."""
    replica = get_replica_context()
    if replica is not None:
        return int(replica.num_replicas_in_sync)
    if has_strategy():
        return int(get_strategy().num_replicas_in_sync)
    return 1


def _workers_averaged_outside_run() -> int:
    """Outside every scope and `run`: how many workers a backward's gradients are averaged
    over (this process's `MultiWorkerMirroredStrategy`, Note [Outside run]), else 1."""
    if context.current_replica_context() is not None or has_strategy():
        return 1
    strategy = live_multi_worker_strategy()
    return int(strategy.num_replicas_in_sync) if strategy is not None else 1


def _as_loss_tensor(value: Any, name: str, function: str) -> torch.Tensor:
    """`value` as a tensor (a list or number is converted, as `tf.convert_to_tensor` does);
    integer and boolean losses become the default float dtype so the average is not truncated."""
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ArgumentTypeError(
                f"{function}: {name} must be a tensor (or a list of numbers), got "
                f"{type(value).__name__} ({error}). A PerReplica value means the call is "
                "outside strategy.run: call it inside the function given to strategy.run."
            ) from None
    if not (tensor.is_floating_point() or tensor.is_complex()):
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


_ORDER = (
    "(The second positional argument is global_batch_size; TensorFlow's is sample_weight: "
    "pass sample_weight=... by name.)"
)


def _checked_batch_size(global_batch_size: Any) -> int:
    """A non-negative integer (a Python int or an integer scalar tensor), as TF asserts."""
    value = global_batch_size
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise InvalidArgumentError(
                f"compute_average_loss: global_batch_size must be a scalar, got a tensor of "
                f"shape {tuple(value.shape)}. Pass the number of examples in one global "
                f"batch. {_ORDER}"
            )
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise ArgumentTypeError(
                f"compute_average_loss: global_batch_size must be an integer, got a {value.dtype} "
                f"tensor. Pass an int, such as GLOBAL_BATCH_SIZE = 64. {_ORDER}"
            )
        value = int(value.item())
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(
            f"compute_average_loss: global_batch_size must be an integer, got "
            f"{type(value).__name__} {value!r}. Pass an int, such as GLOBAL_BATCH_SIZE = 64. "
            f"{_ORDER}"
        )
    value = int(value)
    if value < 0:
        raise InvalidArgumentError(
            f"compute_average_loss: global_batch_size must be non-negative, got {value}. "
            "Pass the number of examples in one global batch."
        )
    return value


def _weighted(per_example_loss: torch.Tensor, sample_weight: Any) -> torch.Tensor:
    """`per_example_loss * sample_weight`, the weight's rank first matched to the loss's as
    TensorFlow does (a last axis added to, or a size-1 last axis dropped from, the weight)."""
    weight = _as_loss_tensor(sample_weight, "sample_weight", "compute_average_loss")
    weight = weight.to(device=per_example_loss.device, dtype=per_example_loss.dtype)
    if weight.dim() == per_example_loss.dim() - 1 and weight.dim() > 0:
        weight = weight.unsqueeze(-1)
    elif weight.dim() == per_example_loss.dim() + 1 and weight.shape[-1] == 1:
        weight = weight.squeeze(-1)
    try:
        torch.broadcast_shapes(per_example_loss.shape, weight.shape)
    except RuntimeError:
        raise InvalidArgumentError(
            f"compute_average_loss: sample_weight of shape {tuple(weight.shape)} does not "
            f"broadcast to per_example_loss of shape {tuple(per_example_loss.shape)}. Pass a "
            "scalar, one weight per example, or one per loss element."
        ) from None
    return per_example_loss * weight


def compute_average_loss(
    per_example_loss: Any,
    global_batch_size: int | torch.Tensor | None = None,
    sample_weight: Any = None,
) -> torch.Tensor:
    """Sum `per_example_loss` (weighted) and divide by the global batch size, as
    `tf.nn.compute_average_loss` does, with a gradient fit for nbdist's gradient averaging.

    Use it inside the step given to `strategy.run`, as TensorFlow's custom-training tutorial
    does: the value is TensorFlow's (so `strategy.reduce("sum", losses, axis=None)` is the
    global-batch mean loss), and after nbdist averages the replicas' gradients the step is
    the one-device step on the mean over the global batch (Note [Averaged, not summed]: the
    returned loss's gradient is `num_replicas_in_sync` times that of its value). Outside
    `run`, on engines or under torchrun, where nbdist averages a backward's gradients over the
    workers too, a given `global_batch_size` is scaled for that averaging (Note [Outside run]).

    Args:
        per_example_loss: One loss per example (rank 1 or more: `reduction="none"` of a
            PyTorch loss). Every element is summed.
        global_batch_size: Examples in one global batch. None: this replica's batch times
            `num_replicas_in_sync` (right only when every replica has the same batch); a
            value that does not match the batches seen scales the gradient by
            `seen / global_batch_size`, as in TensorFlow (0 gives 0).
        sample_weight: A scalar, one weight per example, or one per loss element.

    Returns:
        A scalar tensor of `per_example_loss`'s floating dtype.

    Raises:
        ContextError: `global_batch_size` left out in cross-replica context (a
            `RuntimeError`, as TensorFlow's).
        InvalidArgumentError: a scalar `per_example_loss`, a negative or non-scalar
            `global_batch_size`, or a `sample_weight` that does not broadcast.
        ArgumentTypeError: a `global_batch_size` that is not an integer.

    Example:
        >>> import torch, nbdist as nd
        >>> nd.compute_average_loss(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), global_batch_size=10)
        tensor(1.5000)
        >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
        >>> losses = s.run(nd.compute_average_loss, args=(torch.tensor([2.5, 6.2, 5.0]),))
        >>> round(float(s.reduce("sum", losses, axis=None)), 4)   # the mean of the 3 values
        4.5667
    """
    per_example_loss = _as_loss_tensor(per_example_loss, "per_example_loss", "compute_average_loss")
    if per_example_loss.dim() == 0:
        raise InvalidArgumentError(
            "Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1, "
            "got a scalar. Compute the loss with reduction='none' (one value per example)."
        )
    input_dtype = per_example_loss.dtype
    if sample_weight is not None:
        per_example_loss = _weighted(per_example_loss, sample_weight).to(input_dtype)
    if global_batch_size is None:
        if has_strategy() and in_cross_replica_context():
            raise ContextError(
                "You are calling `compute_average_loss` in cross replica context, while it was "
                "expected to be called in replica context. Call it inside the function given "
                "to strategy.run, or pass global_batch_size."
            )
        replicas = _replicas_in_sync()
        batch = replicas * per_example_loss.shape[0]
    else:
        batch = _checked_batch_size(global_batch_size)
        replicas = _replicas_in_sync()
        if replicas == 1:
            replicas = _workers_averaged_outside_run()
        _warn_if_larger_than_global(per_example_loss.shape[0], batch, replicas)
    total = per_example_loss.sum()
    loss = total / batch if batch else total * 0  # TF's div_no_nan: 0 for an empty batch
    return _scale_gradient(loss, replicas)


def _warn_if_larger_than_global(local: int, global_batch_size: int, replicas: int) -> None:
    """Warn when this replica alone holds more examples than its share of the global batch
    can: `global_batch_size` is then surely not the global batch (often the per-replica
    batch size passed by mistake), and every step is `seen / global_batch_size` too large."""
    if replicas > 1 and local > math.ceil(global_batch_size / replicas):
        warnings.warn(
            f"compute_average_loss: this replica has {local} examples, more than its share "
            f"of global_batch_size={global_batch_size} over {replicas} replicas allows. Pass "
            "the global batch size (all replicas together), not the per-replica one; as it "
            "is, the gradient is scaled by (examples seen) / global_batch_size.",
            NbdistWarning,
            stacklevel=3,
        )


def scale_regularization_loss(regularization_loss: Any) -> torch.Tensor:
    """Sum `regularization_loss` and divide by `num_replicas_in_sync`, as
    `tf.nn.scale_regularization_loss` does, with a gradient fit for nbdist's averaging.

    The value is TensorFlow's (summed over replicas, the regularisation loss once); the
    gradient is that of the whole regularisation loss on every replica, so after nbdist
    averages, the step is the one-device step (Note [Averaged, not summed]).

    Raises:
        ContextError: called in cross-replica context (a `RuntimeError`, as TensorFlow's).

    Example:
        >>> import torch, nbdist as nd
        >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
        >>> per_replica = s.run(nd.scale_regularization_loss, args=(torch.tensor([2.5, 6.2, 5.0]),))
        >>> round(float(s.reduce("sum", per_replica, axis=None)), 4)
        13.7
    """
    if has_strategy() and in_cross_replica_context():
        raise ContextError(
            "You are calling `scale_regularization_loss` in cross replica context, while it "
            "was expected to be called in replica context. Call it inside the function given "
            "to strategy.run."
        )
    loss = _as_loss_tensor(regularization_loss, "regularization_loss", "scale_regularization_loss")
    replicas = _replicas_in_sync()
    return _scale_gradient(loss.sum() / replicas, replicas)
