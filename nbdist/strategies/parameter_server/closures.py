"""How a scheduled function travels to a worker: cloudpickle, with references for what lives
elsewhere.

Variables and module parameters of the strategy are sent as their description (`VarSpec`:
name, shape, shards), never their values: the worker reads the values from the ps tasks. The
strategy is sent as a reference (the worker has its own), and per-worker datasets and
iterators as their id (each worker has its own component). Everything else is pickled by
value (functions defined in a notebook too), so what cannot be pickled fails at `schedule`.

Example:
    >>> spec = VarSpec(1, "w", (2,), torch.float32, True, "variable", ((0, 5, 2),))
    >>> spec.rows
    2
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle
import torch

__all__ = ["ClosurePickler", "VarSpec", "dumps_closure", "loads_closure"]


@dataclasses.dataclass(frozen=True)
class VarSpec:
    """A variable of the strategy as workers see it.

    `shards` holds `(ps index, shard id on that ps, rows)` in row order; an unsplit variable
    has one shard. `kind` is "parameter" (a module parameter) or "variable" (`nd.Variable`).
    """

    vid: int
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    kind: str
    shards: tuple[tuple[int, int, int], ...]

    @property
    def rows(self) -> int:
        return sum(rows for _, _, rows in self.shards)


class ClosurePickler(cloudpickle.Pickler):
    """cloudpickle with `lookup(obj)` deciding which objects travel as a reference."""

    def __init__(self, file: io.BytesIO, lookup: Callable[[Any], Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._lookup = lookup

    def persistent_id(self, obj: Any) -> Any:
        return self._lookup(obj)


def dumps_closure(value: Any, lookup: Callable[[Any], Any]) -> bytes:
    """Pickle `value`, sending what `lookup` names (a non-None answer) as a reference."""
    buffer = io.BytesIO()
    ClosurePickler(buffer, lookup).dump(value)
    return buffer.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, resolve: Callable[[Any], Any]):
        super().__init__(file)
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        return self._resolve(pid)


def loads_closure(data: bytes, resolve: Callable[[Any], Any]) -> Any:
    """Unpickle what `dumps_closure` wrote, turning each reference into `resolve(ref)`."""
    return _Unpickler(io.BytesIO(data), resolve).load()
