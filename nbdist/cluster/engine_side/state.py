"""What this engine knows about itself: its interactive namespace, strategy, rank and group.

Runs on the engine (`attach` and `joining.bootstrap` fill it in, the other
engine-side modules read it). It lives in one small module so that every engine-side job
reads the same state without importing the others.

Example (on an engine that joined the cluster)::

    from nbdist.cluster.engine_side import state
    state.namespace()["strategy"] is state.strategy()     # True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "attach",
    "current_strategy",
    "group",
    "namespace",
    "namespace_or_empty",
    "rank",
    "set_strategy",
    "strategy",
]

_state: dict[str, Any] = {"namespace": None, "strategy": None, "rank": None}


def attach(user_ns: dict[str, Any]) -> None:
    """Remember the engine's interactive namespace (IPython's `user_ns`).

    The first thing the notebook runs on a new engine (`bringup.ATTACH`), so that
    `bootstrap` and the calls can reach the names the user's cells define.
    """
    _state["namespace"] = user_ns


def set_strategy(strategy: Any, rank: int) -> None:
    """Record the engine's strategy and its rank in the group (`joining.bootstrap`)."""
    _state["strategy"] = strategy
    _state["rank"] = rank


def namespace() -> dict[str, Any]:
    """The engine's interactive namespace; an error naming the fix if it was never attached."""
    user_ns = _state["namespace"]
    if user_ns is None:
        from nbdist.errors import ContextError

        raise ContextError(
            "This engine was not attached to an nbdist Cluster (its namespace is unknown). "
            "Start engines with nd.Cluster(...).start()."
        )
    return user_ns


def namespace_or_empty() -> dict[str, Any]:
    """The engine's interactive namespace, or `{}` before `attach` (for read-only reports)."""
    return _state["namespace"] or {}


def strategy() -> Any:
    """The engine's `MultiWorkerMirroredStrategy`; an error naming the fix before `bootstrap`."""
    current = _state["strategy"]
    if current is None:
        from nbdist.errors import ContextError

        raise ContextError(
            "This engine has no strategy yet: it did not finish joining the cluster. Restart "
            "the cluster with cluster.restart()."
        )
    return current


def current_strategy() -> Any | None:
    """The engine's strategy, or None before `bootstrap` (never raises)."""
    return _state["strategy"]


def rank() -> int | None:
    """This engine's rank in the group (its replica id), or None before `bootstrap`."""
    return _state["rank"]


def group() -> Any | None:
    """The strategy's process group (`nbdist.collectives` group), or None without one."""
    return getattr(_state["strategy"], "process_group", None)
