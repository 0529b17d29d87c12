"""`EngineInfo` (where an engine runs) and `EngineStatus` rows (`Cluster.status()`).

Example:
    >>> rows = StatusTable([EngineStatus(0, 0, "node1", 4242, "cpu:0", "alive")])
    >>> print(rows)
    replica  engine  host   pid   device  state
          0       0  node1  4242  cpu:0   alive
    >>> rows.alive
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ENGINE_STATES", "EngineInfo", "EngineStatus", "StatusTable"]

ENGINE_STATES = ("alive", "busy", "dead")
"""`alive`: registered and idle; `busy`: running a request; `dead`: exited or unregistered."""


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """One engine of a running cluster.

    Attributes:
        id: ipyparallel's engine id.
        rank: The engine's rank in the process group = its replica id.
        host: Host name.
        pid: Process id (on `host`).
        device: The device its replica computes on (`"cpu:0"`, `"cuda:0"`).
        gpu: The physical GPU it is pinned to (`CUDA_VISIBLE_DEVICES`), or None.
        stacks: `(address, port, token)` of its stack server (`cluster.stacks()`), or None.
    """

    id: int
    rank: int
    host: str
    pid: int
    device: str
    gpu: str | None = None
    stacks: tuple | None = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """One row of `Cluster.status()`; `state` is one of `ENGINE_STATES`."""

    rank: int
    id: int
    host: str
    pid: int
    device: str
    state: str
    gpu: str | None = None


class StatusTable(tuple):
    """`EngineStatus` rows in replica order; prints as a table, then the size history when
    the cluster was resized (`history`: the cluster's `SizeChange`s, the start first)."""

    history: tuple = ()

    def __new__(cls, rows: Any = (), *, history: Any = ()) -> StatusTable:
        table = super().__new__(cls, rows)
        table.history = tuple(history)
        return table

    @property
    def alive(self) -> bool:
        """True when every engine is alive or busy (none dead)."""
        return all(row.state != "dead" for row in self)

    def __str__(self) -> str:
        header = ("replica", "engine", "host", "pid", "device", "state")
        rows = [(str(r.rank), str(r.id), r.host, str(r.pid), _device(r), r.state) for r in self]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        right = {0, 1}

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(
                cell.rjust(width) if i in right else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(cells, widths))
            ).rstrip()

        text = "\n".join(line(row) for row in [header, *rows])
        if len(self.history) > 1:
            text += "\nsize history:\n" + "\n".join(f"  {change}" for change in self.history)
        return text

    def __repr__(self) -> str:
        return str(self) if self else "StatusTable(no engines)"


def _device(row: EngineStatus) -> str:
    return row.device if row.gpu is None else f"{row.device} (GPU {row.gpu})"
