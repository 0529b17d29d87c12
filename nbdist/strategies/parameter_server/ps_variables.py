"""Variables of a `ParameterServerStrategy` as the chief sees them: reads and writes go to
the ps tasks.

`PSVariable` is an `nd.Variable` whose value lives on ps tasks, split into shards when a
partitioner asked for it (TF's `ShardedVariable`): `.variables` lists the shards (name, shape,
ps device); reading gives the whole tensor. It reads and writes through the strategy's
`ShardStore` (the chief's clients of the ps tasks), never through the strategy itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nbdist.core.variables import Variable, VariableAggregation, VariableSynchronization
from nbdist.strategies.parameter_server.closures import VarSpec
from nbdist.strategies.parameter_server.transport import PSClient
from nbdist.strategies.parameter_server.variable_placement import Shard

__all__ = ["PSVariable", "ShardStore", "ShardView"]


class ShardStore:
    """The ps tasks as the chief reads and writes them: one client per ps task (made on first
    use, with the `timeout()` of that moment), and whole tensors split into their shards
    (`VarSpec.shards`: ps, shard id, rows) and joined from them.

    Example (needs running ps tasks, so not run here)::

        store = ShardStore(["127.0.0.1:2222"], timeout=lambda: 300.0)
        store.assign(spec, torch.zeros(4)); store.read(spec)
    """

    def __init__(self, addresses: list[str], timeout: Callable[[], float]):
        self._addresses = addresses
        self._timeout = timeout
        self._clients: dict[int, PSClient] = {}

    def client(self, ps: int) -> PSClient:
        """The client of ps task `ps` (connected on first use)."""
        if ps not in self._clients:
            self._clients[ps] = PSClient(ps, self._addresses[ps], self._timeout())
        return self._clients[ps]

    def _split(self, spec: VarSpec, tensor: torch.Tensor) -> dict[int, dict[int, torch.Tensor]]:
        out: dict[int, dict[int, torch.Tensor]] = {}
        row = 0
        for ps, shard, rows in spec.shards:
            part = tensor[row : row + rows] if len(spec.shards) > 1 else tensor
            out.setdefault(ps, {})[shard] = part.contiguous()
            row += rows
        return out

    def assign(self, spec: VarSpec, tensor: torch.Tensor) -> None:
        """Write `tensor` (the whole value) into `spec`'s shards."""
        for ps, values in self._split(spec, tensor.detach().cpu()).items():
            self.client(ps).assign(values)

    def add(self, spec: VarSpec, tensor: torch.Tensor) -> None:
        """Add `tensor` (the whole value) to `spec`'s shards."""
        for ps, values in self._split(spec, tensor.detach().cpu()).items():
            self.client(ps).add(values)

    def read(self, spec: VarSpec) -> torch.Tensor:
        """The whole value of `spec`, joined from its shards."""
        parts = [self.client(ps).read([shard])[0] for ps, shard, _ in spec.shards]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, 0)).reshape(spec.shape)

    def close(self) -> None:
        """Close the clients (a later read connects again)."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()


class ShardView:
    """One shard of a variable on a ps task: `name` (`NAME/part_i`), `shape`, `device`."""

    def __init__(self, store: ShardStore, shard: Shard, ps_id: int):
        self._store = store
        self._shard = shard
        self._ps_id = ps_id
        self.name = shard.name
        self.shape = torch.Size(shard.shape)
        self.device = shard.device
        self.ps = shard.ps

    def read_value(self) -> torch.Tensor:
        """The shard's current value (read from its ps task)."""
        return self._store.client(self.ps).read([self._ps_id])[0]

    def numpy(self) -> Any:
        return self.read_value().numpy()

    def __repr__(self) -> str:
        return f"<ShardView {self.name!r} shape={list(self.shape)} on {self.device}>"


class PSVariable(Variable):
    """A variable held by the ps tasks (one shard or several); see the module docstring."""

    def __init__(
        self,
        store: ShardStore,
        spec: VarSpec,
        shards: list[Shard],
        trainable: bool,
        synchronization: VariableSynchronization = VariableSynchronization.ON_WRITE,
        aggregation: VariableAggregation = VariableAggregation.NONE,
    ):
        self._store = store
        self._spec = spec
        self._shards = shards
        self._name = spec.name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._device = shards[0].device

    @property
    def variables(self) -> tuple[ShardView, ...]:
        """The shards in row order (one for an unsplit variable)."""
        return tuple(
            ShardView(self._store, shard, ps_id)
            for shard, (_, ps_id, _) in zip(self._shards, self._spec.shards)
        )

    @property
    def dtype(self) -> torch.dtype:
        return self._spec.dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._spec.shape)

    def _read(self) -> torch.Tensor:
        return self._store.read(self._spec)

    # A read brings a new tensor from the ps tasks: no need for `Variable`'s defensive clone
    # (a second full copy of a large table).
    def read_value(self) -> torch.Tensor:
        """The current value, fetched from the ps tasks as a new tensor."""
        return self._read()

    def value(self) -> torch.Tensor:
        """The current value, fetched from the ps tasks as a new tensor."""
        return self._read()

    def numpy(self) -> Any:
        """The current value as a NumPy array (fetched from the ps tasks)."""
        return self._read().numpy()

    def _write(self, value: Any, method: str) -> Variable:
        tensor = torch.as_tensor(value, dtype=self._spec.dtype).expand(self._spec.shape)
        if method == "assign":
            self._store.assign(self._spec, tensor)
        else:
            sign = 1 if method == "assign_add" else -1
            self._store.add(self._spec, sign * tensor)
        return self

    def __repr__(self) -> str:
        where = ", ".join(shard.device for shard in self._shards)
        return f"<nbdist.PSVariable {self.name!r} shape={list(self.shape)} on {where}>"
