"""The current strategy and replica context, held in `contextvars` (no global singletons).

Cross-replica context: inside `strategy.scope()`, outside `run`. Replica context: inside the
function given to `strategy.run`. Outside every scope the default strategy answers. This module
stores state only; strategies create the objects it holds. Imports nothing from nbdist but errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from nbdist.errors import StrategyMixingError

# The objects held are `nbdist.Strategy` and `nbdist.ReplicaContext`; this module does not
# import them (the core does not depend on the strategies), so they are typed by these names.
Strategy = Any
ReplicaContext = Any

__all__ = [
    "begin_threaded_run",
    "current_replica_context",
    "current_scope_strategy",
    "end_threaded_run",
    "enter_replica_context",
    "enter_strategy",
    "in_merge_call",
    "run_started_before",
]

# The strategy whose scope is active (None: the default strategy answers).
_scope_strategy: contextvars.ContextVar[Strategy | None] = contextvars.ContextVar(
    "nbdist_scope_strategy", default=None
)
# The replica context inside `run` (None: cross-replica, or outside every scope).
_replica_context: contextvars.ContextVar[ReplicaContext | None] = contextvars.ContextVar(
    "nbdist_replica_context", default=None
)
# True inside a `merge_call` function (cross-replica context, even for the default strategy).
_merging: contextvars.ContextVar[bool] = contextvars.ContextVar("nbdist_merging", default=False)
# The strategy made current with `experimental_set_strategy` (outside any `with`).
_set_strategy: contextvars.ContextVar[Strategy | None] = contextvars.ContextVar(
    "nbdist_set_strategy", default=None
)


def current_scope_strategy() -> Strategy | None:
    """The strategy whose scope (or `experimental_set_strategy`) is active, else None."""
    return _scope_strategy.get() or _set_strategy.get()


# `current_replica_context()`: the replica context of the `run` we are inside, else None.
# `in_merge_call()`: True inside a `merge_call` function (entered with
# `enter_replica_context(None)`). Both are the context variables' own `get`: every user
# collective asks, and a Python function around it would cost a frame (Note [Calls per
# collective]).
current_replica_context: Callable[[], ReplicaContext | None] = _replica_context.get
in_merge_call: Callable[[], bool] = _merging.get


@contextlib.contextmanager
def enter_strategy(strategy: Strategy) -> Iterator[None]:
    """Make `strategy` current in cross-replica context (the body of `Strategy.scope`).

    Raises:
        StrategyMixingError: another, different strategy is already current.
    """
    active = current_scope_strategy()
    if active is not None and active is not strategy and _changes_context(active):
        raise StrategyMixingError(
            f"Mixing different nbdist.Strategy objects: {type(strategy).__name__} was entered "
            f"while the scope of {type(active).__name__} is active. Leave the first strategy's "
            "scope (or experimental_set_strategy(None)) before using another one."
        )
    with _entered(strategy, None, merging=False):
        yield


@contextlib.contextmanager
def _entered(
    strategy: Strategy | None, replica_context: ReplicaContext | None, *, merging: bool
) -> Iterator[None]:
    """Set the three context variables (strategy, replica context, in a merge call), and
    reset them on exit."""
    strategy_token = _scope_strategy.set(strategy)
    replica_token = _replica_context.set(replica_context)
    merging_token = _merging.set(merging)
    try:
        yield
    finally:
        _merging.reset(merging_token)
        _replica_context.reset(replica_token)
        _scope_strategy.reset(strategy_token)


def _changes_context(strategy: Strategy) -> bool:
    """False for the default strategy, whose scope changes no context (TF's default strategy)."""
    return getattr(strategy, "changes_context", True)


def set_strategy_context(
    strategy: Strategy, replica_context: ReplicaContext | None = None
) -> tuple[Any, Any]:
    """Make `strategy` current without a `with` block, in cross-replica context or, given one,
    in `replica_context` (which must be one of `strategy`'s), for a caller that already checked
    it mixes no strategies (`Strategy.run`); returns `reset`'s tokens."""
    return _scope_strategy.set(strategy), _replica_context.set(replica_context)


def reset(tokens: tuple[Any, Any]) -> None:
    """Leave what `set_strategy_context` entered."""
    _replica_context.reset(tokens[1])
    _scope_strategy.reset(tokens[0])


def enter_replica_context(
    replica_context: ReplicaContext | None,
) -> contextlib.AbstractContextManager[None]:
    """Enter a replica's context (or, with None, cross-replica context for a `merge_call`);
    use it in a `with` statement at once."""
    strategy = (
        replica_context.strategy if replica_context is not None else current_scope_strategy()
    )
    return _entered(strategy, replica_context, merging=replica_context is None)


def set_strategy(strategy: Strategy | None) -> None:
    """Make `strategy` current without `with` (the body of `experimental_set_strategy`)."""
    active = _scope_strategy.get()
    if strategy is not None and active is not None and active is not strategy:
        raise StrategyMixingError(
            f"Mixing different nbdist.Strategy objects: experimental_set_strategy("
            f"{type(strategy).__name__}) was called inside the scope of {type(active).__name__}. "
            "Leave that scope first."
        )
    _set_strategy.set(strategy)


# Note [Threads started in a replica]: Python threads do not inherit `contextvars`, so a thread
# that a replica function starts sees the default replica context (as in TensorFlow, whose
# per-thread mode is thread-local), and its `all_reduce` would quietly return its own input.
# Each in-process `run` with several replica threads records the threads alive when it began;
# a default-context collective in a thread that is not among them, while that run lies open,
# is refused by name (`ReplicaContext`'s check) instead.
_threaded_runs: dict[int, tuple[Strategy, list[threading.Thread]]] = {}
_run_ids = itertools.count()


def begin_threaded_run(strategy: Strategy) -> int:
    """Record a `run` of `strategy` whose replicas are threads of this process (Note [Threads
    started in a replica]); returns the key for `end_threaded_run`."""
    key = next(_run_ids)
    _threaded_runs[key] = (strategy, threading.enumerate())
    return key


def end_threaded_run(key: int) -> None:
    """Forget the run that `begin_threaded_run` recorded."""
    _threaded_runs.pop(key, None)


def run_started_before(thread: threading.Thread) -> Strategy | None:
    """The strategy of an open threaded `run` that began before `thread` existed, else None.

    Example:
        >>> run_started_before(threading.current_thread()) is None
        True
    """
    for strategy, alive in list(_threaded_runs.values()):
        if thread not in alive:
            return strategy
    return None
