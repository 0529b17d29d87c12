"""`ClusterHandle`: what the engine-call path and the engine strategy need of a `Cluster`.

`engines` (the `Cluster`) imports `engine_calls` and `supervisor` (the engine-call path) and
`engine_strategy` (`EngineStrategy`), and they act on the cluster they were given. Naming
that cluster by this protocol, not by `Cluster`, keeps the imports one way: `engines` imports
them, they never import `engines` (not even for type checking). `Cluster` implements it.

Example:
    >>> from nbdist.cluster.engines import Cluster
    >>> members = ["num_engines", "engines", "client", "push", "call", "repair"]
    >>> all(hasattr(Cluster, name) for name in members)  # Cluster has what the protocol names
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nbdist.cluster.status import EngineInfo

__all__ = ["ClusterHandle"]


class ClusterHandle(Protocol):
    """The members of `Cluster` that the engine-call path and `engine_strategy` use (see
    `Cluster` for each)."""

    @property
    def num_engines(self) -> int: ...

    @property
    def engines(self) -> tuple[EngineInfo, ...]: ...

    @property
    def client(self) -> Any: ...

    def push(self, values: dict[str, Any], *, timeout: float | None = None) -> None: ...

    def call(
        self,
        entry: Callable[..., dict[str, Any]],
        payloads: bytes | Sequence[Any],
        *extra: Any,
        timeout: float | None,
        what: str,
        fn: Any = None,
        needs_group: bool = False,
    ) -> list[dict[str, Any]]: ...

    def track_request(self, engine_id: int, request: Any) -> None: ...

    def require_alive(self, what: str, fix: str = "cluster.restart()") -> None: ...

    def reform_when_idle(self, reason: str) -> None: ...

    def mark_broken(self, reason: str) -> None: ...

    def group_store(self) -> tuple[str, int, str] | None: ...

    def abort_group(self, reason: str) -> bool: ...

    def repair(self, reason: str) -> str | None: ...

    def forget_repair(self) -> None: ...
