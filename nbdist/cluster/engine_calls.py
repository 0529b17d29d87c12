"""`call_engines`: `strategy.run`, `run_steps`, `push` and `pull` on every engine.

The API's calls into the engines, on the one engine-call path (`supervisor.supervise`): the
engine-side entry point is passed as a function (`engine_side.calls.call`, `call_steps`,
`store`, `fetch`); this module adds what only the API's calls need: the engines must be alive
first, and a `NameError` for a name that exists in the notebook but not on the engines gets a
note saying how to send it.

Example (needs engines, so not run here)::

    from nbdist.cluster.engine_side import entry_points as entries
    replies = call_engines(cluster, entries.call, payload, timeout=60, what="strategy.run(f)")
    replies[0]["value"]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist.cluster import _wire
from nbdist.cluster.errors import RemoteFailure
from nbdist.cluster.supervisor import Call, supervise

if TYPE_CHECKING:
    from nbdist.cluster.handle import ClusterHandle

__all__ = ["call_engines"]


def call_engines(
    cluster: ClusterHandle,
    entry: Callable[..., dict[str, Any]],
    payloads: bytes | Sequence[Any],
    *extra: Any,
    timeout: float | None,
    what: str,
    fn: Any = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Call `entry(payload, *extra)` on every engine; replies in replica order.

    Args:
        cluster: A running cluster (the caller holds its turn).
        entry: An engine-side function returning a reply dict, e.g.
            `engine_side.calls.call` (sent by reference).
        payloads: One payload for every engine, or a list with one per engine.
        extra: More arguments, the same for every engine.
        timeout: Seconds to wait (None: no limit), as the error names it.
        deadline: When the wait ends on `time.monotonic()`'s clock, if the call's `timeout`
            began earlier (it waited for its turn); default `timeout` s from now.
        what: How to name the call in errors, e.g. `"strategy.run(step)"`.
        fn: The user's function, for hints about names it uses.

    Returns:
        The reply dicts in replica order, each `"value"` unpickled.

    Raises:
        WorkerLostError: an engine is dead (nothing was sent).
        RemoteError: one or more engines failed.
        EngineTimeoutError: not every engine finished within `timeout`.
        SerializationError: a result cannot be unpickled here.
    """
    cluster.require_alive(what)
    return supervise(
        cluster, cluster.engines, entry, payloads, *extra,
        call=Call(what=what, hints=_notes(fn)), timeout=timeout, deadline=deadline,
    )  # fmt: skip


def _notes(fn: Any) -> Callable[[list[RemoteFailure]], list[str]]:
    """Hints whose fix is in the notebook (a name that exists here but not on the engines)."""

    def hints(failures: list[RemoteFailure]) -> list[str]:
        known = getattr(fn, "__globals__", None) if _wire.is_namespace_function(fn) else None
        if not known:
            return []
        for failure in failures:
            if failure.ename != "NameError" or failure.evalue.count("'") < 2:
                continue
            name = failure.evalue.split("'")[1]
            if name in known:
                return [
                    f"Note: {name!r} exists in this notebook but not on the engines; functions "
                    "run there look names up in the engine's namespace. Send it with "
                    f"cluster.push({{{name!r}: {name}}}) or define it on the engines."
                ]
        return []

    return hints
