"""TensorFlow's module functions: which strategy and which context the caller is in."""

from __future__ import annotations

import threading

from nbdist import context
from nbdist.reduce import ReduceOp
from nbdist.strategies.base import ReplicaContext, Strategy
from nbdist.strategies.one_device import DefaultStrategy

__all__ = [
    "experimental_set_strategy",
    "get_loss_reduction",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]

_default_lock = threading.Lock()
_default: list[DefaultStrategy] = []


def _default_strategy() -> DefaultStrategy:
    with _default_lock:
        if not _default:
            _default.append(DefaultStrategy())
        return _default[0]


def get_strategy() -> Strategy:
    """The current strategy; outside every scope, the default (one-replica) strategy.

    Example:
        >>> import nbdist as nd
        >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
        >>> with s.scope():
        ...     nd.get_strategy() is s
        True
    """
    replica = context.current_replica_context()
    if replica is not None:
        return replica.strategy
    return context.current_scope_strategy() or _default_strategy()


def has_strategy() -> bool:
    """True inside a non-default strategy's scope or replica context.

    Example:
        >>> import nbdist as nd
        >>> nd.has_strategy()
        False
    """
    strategy = context.current_scope_strategy()
    return strategy is not None and not isinstance(strategy, DefaultStrategy)


def get_replica_context() -> ReplicaContext | None:
    """The replica context: inside `run` the replica's, in cross-replica context None,
    outside every scope the default replica context (replica 0 of the default strategy).

    Example:
        >>> import nbdist as nd
        >>> s = nd.OneDeviceStrategy("cpu")
        >>> with s.scope():
        ...     nd.get_replica_context() is None
        True
    """
    replica = context.current_replica_context()
    if replica is not None:
        return replica
    if context.current_scope_strategy() is not None:
        return None
    return ReplicaContext(_default_strategy(), 0, 0)


def in_cross_replica_context() -> bool:
    """True inside `strategy.scope()` and outside `run` (and inside a `merge_call` function).

    Example:
        >>> import nbdist as nd
        >>> nd.in_cross_replica_context()
        False
    """
    return (
        context.current_scope_strategy() is not None and context.current_replica_context() is None
    )


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Make `strategy` current without `with strategy.scope()` (None resets to the default).

    Example:
        >>> import nbdist as nd
        >>> s = nd.OneDeviceStrategy("cpu")
        >>> nd.experimental_set_strategy(s); nd.get_strategy() is s
        True
        >>> nd.experimental_set_strategy(None)
    """
    if strategy is not None and not isinstance(strategy, Strategy):
        raise TypeError(f"experimental_set_strategy takes a Strategy or None, got {strategy!r}.")
    context.set_strategy(strategy)


def get_loss_reduction() -> ReduceOp:
    """The reduction of the last loss: `ReduceOp.MEAN` by default, as PyTorch losses average.

    Example:
        >>> import nbdist as nd
        >>> nd.get_loss_reduction()
        <ReduceOp.MEAN: 'MEAN'>
    """
    return ReduceOp.MEAN
