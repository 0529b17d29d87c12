"""`EngineNamespaces`: `cluster.push` and `cluster.pull`, values into and out of the engines.

A mixin of `Cluster` (its methods are the cluster's): `push` assigns names in every engine's
namespace (a `PerReplica` value scattered, component `i` to engine `i`), `pull` brings each
engine's value back as one `PerReplica`. Both go through `Cluster.call`, the one call path.

Example (needs running engines, so not run here)::

    cluster.push({"lr": 0.1})
    cluster.pull("lr")          # PerReplica:{0: 0.1, 1: 0.1}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbdist.cluster import _wire
from nbdist.cluster.engine_side import entry_points as entries
from nbdist.cluster.engine_strategy import _has_distributed, _scatter
from nbdist.core.values import PerReplica

if TYPE_CHECKING:
    from nbdist.cluster.handle import ClusterHandle

__all__ = ["EngineNamespaces"]


class EngineNamespaces:
    """`push` and `pull` of `Cluster` (see the module's docstring)."""

    if TYPE_CHECKING:  # the Cluster members used here, as ClusterHandle names them
        num_engines = ClusterHandle.num_engines
        call = ClusterHandle.call

    def push(self, values: dict[str, Any], *, timeout: float | None = None) -> None:
        """Assign `values` (`{name: value}`) in every engine's namespace.

        A `PerReplica` value is scattered: engine `i` gets component `i`.
        """
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"push takes a dict of {{name: value}} with string names, got {values!r}; "
                "e.g. cluster.push({'lr': 0.1})."
            )
        n = self.num_engines
        parts = [(f"values[{key!r}]", value) for key, value in values.items()]
        if _has_distributed(values):
            payload: Any = [_wire.encode(_scatter(values, i, n), parts) for i in range(n)]
        else:
            payload = _wire.encode(values, parts)
        self.call(entries.store, payload, timeout=timeout, what="cluster.push")

    def pull(self, *names: str, timeout: float | None = None) -> Any:
        """Each engine's value of `name` as one `PerReplica` (a tuple of them for several).

        Names may be dotted paths (`"model.fc.weight"`); tensors come back detached, on the
        CPU.
        """
        from nbdist.cluster.refs import RemoteRef

        if not names:
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                "pull needs at least one variable name, e.g. cluster.pull('loss')."
            )
        for name in names:
            RemoteRef(name)  # checks the name
        payload = _wire.dumps(list(names))
        replies = self.call(entries.fetch, payload, timeout=timeout, what="cluster.pull")
        pulled = tuple(
            PerReplica([reply["value"][k] for reply in replies]) for k in range(len(names))
        )
        return pulled[0] if len(names) == 1 else pulled
