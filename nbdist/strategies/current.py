"""TensorFlow's module functions: which strategy and which context the caller is in."""

from __future__ import annotations

import threading

from nbdist.core import context
from nbdist.core.reduce.op import ReduceOp
from nbdist.errors import ArgumentTypeError
from nbdist.strategies._compiled import collective_between_graphs
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
_default_replica: list[ReplicaContext] = []


def _default_strategy() -> DefaultStrategy:
    with _default_lock:
        if not _default:
            _default.append(DefaultStrategy())
        return _default[0]


def _default_replica_context() -> ReplicaContext:
    """The one default replica context (TF returns the same object at every call)."""
    strategy = _default_strategy()
    with _default_lock:
        if not _default_replica:
            _default_replica.append(ReplicaContext(strategy, 0, 0))
        return _default_replica[0]


@collective_between_graphs
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


@collective_between_graphs
def has_strategy() -> bool:
    """True inside a non-default strategy's scope or replica context.

    Example:
        >>> import nbdist as nd
        >>> nd.has_strategy()
        False
    """
    strategy = context.current_scope_strategy()
    return strategy is not None and not isinstance(strategy, DefaultStrategy)


@collective_between_graphs
def get_replica_context() -> ReplicaContext | None:
    """The replica context: inside `run` the replica's, in cross-replica context None,
    outside every scope (and inside the default strategy's scope, as in TensorFlow) the
    default replica context (replica 0 of the default strategy).

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
    if _non_default_scope() is not None or context.in_merge_call():
        return None
    return _default_replica_context()


@collective_between_graphs
def in_cross_replica_context() -> bool:
    """True inside `strategy.scope()` and outside `run` (and inside a `merge_call` function).

    The default strategy's scope does not count, as in TensorFlow: it changes no context.

    Example:
        >>> import nbdist as nd
        >>> nd.in_cross_replica_context()
        False
    """
    if context.current_replica_context() is not None:
        return False
    return _non_default_scope() is not None or context.in_merge_call()


def _non_default_scope() -> Strategy | None:
    """The active scope's strategy, unless it is the default strategy.

    TensorFlow's default strategy does not change the context: inside its `scope()` the caller
    stays in the default replica context (replica 0, one replica in sync), not cross-replica.
    """
    strategy = context.current_scope_strategy()
    return strategy if strategy is not None and strategy.changes_context else None


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
        raise ArgumentTypeError(
            f"experimental_set_strategy takes a Strategy or None, got {strategy!r}."
        )
    context.set_strategy(strategy)


def get_loss_reduction() -> ReduceOp:
    """The reduction of the last loss: `ReduceOp.MEAN` by default, as PyTorch losses average.

    Example:
        >>> import nbdist as nd
        >>> nd.get_loss_reduction()
        <ReduceOp.MEAN: 'MEAN'>
    """
    return ReduceOp.MEAN
