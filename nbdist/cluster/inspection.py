"""`Inspection`: what a cluster's engines are and do, read without changing them.

A mixin of `Cluster` (its methods are the cluster's): `status()` (one row per engine: alive,
busy or dead), `stacks()` (every engine's live Python stacks, `%dist stack`) and
`collective_records()` (every engine's collective recorder, for
`nd.debug.compare_collectives`). All of them work while a cell runs.

Example (needs running engines, so not run here)::

    print(cluster.status())                         # replica, engine id, host, pid, state
    nd.debug.format_stacks(cluster.stacks())
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from nbdist.cluster import stacks as engine_stacks
from nbdist.cluster.launch.processes import pid_alive
from nbdist.cluster.status import EngineInfo, EngineStatus, StatusTable
from nbdist.debug.stacks import ReplicaStack

__all__ = ["Inspection"]


class Inspection:
    """`status`, `stacks` and `collective_records` of `Cluster` (see the module's docstring)."""

    _client: Any
    _engines: tuple[EngineInfo, ...]
    _inflight: dict[int, set[Any]]

    if TYPE_CHECKING:  # the Cluster members used here

        def _require_running(self, what: str) -> None: ...

        @property
        def size_history(self) -> tuple[Any, ...]: ...

    def stacks(self, timeout: float = 2.0) -> list[ReplicaStack]:
        """Every engine's live Python stacks, also while a cell runs (`%dist stack`).

        One `nd.debug.ReplicaStack` per replica; engines that are gone or do not answer
        within `timeout` seconds are named by their `state`. Changes nothing on the engines.
        Example: `nd.debug.format_stacks(cluster.stacks())`.
        """
        self._require_running("cluster.stacks()")
        return engine_stacks.stacks(self._engines, timeout)

    def collective_records(self, timeout: float = 2.0) -> dict[int, list[dict[str, Any]]]:
        """Every engine's collective recorder, `{replica: entries}` (oldest first), also
        while a cell runs; `nd.debug.compare_collectives(cluster)` reads it."""
        self._require_running("cluster.collective_records()")
        return engine_stacks.collective_records(self._engines, timeout)

    def status(self) -> StatusTable:
        """One row per engine: replica, engine id, host, pid, device, state.

        `state` is `"alive"` (registered, idle), `"busy"` (running a request sent through
        this cluster: `strategy.run`, `push`, `pull`) or `"dead"` (its process exited or it
        unregistered). (The controller's own queue counts lag behind the replies, so they are
        not used.)
        """
        if not self._engines:
            return StatusTable()
        registered = set(self._client.ids) if self._client is not None else set()
        here = socket.gethostname()
        rows = []
        for info in self._engines:
            alive = info.id in registered and (info.host != here or pid_alive(info.pid))
            busy = bool(self._inflight.get(info.id))
            state = "dead" if not alive else "busy" if busy else "alive"
            rows.append(
                EngineStatus(
                    info.rank, info.id, info.host, info.pid, info.device, state, gpu=info.gpu
                )
            )
        return StatusTable(rows, history=self.size_history)
