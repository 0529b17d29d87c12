"""Variables of a `ParameterServerStrategy` as the chief sees them: reads and writes go to
the ps tasks.

`PSVariable` is an `nd.Variable` whose value lives on ps tasks, split into shards when a
partitioner asked for it (TF's `ShardedVariable`): `.variables` lists the shards (name, shape,
ps device); reading gives the whole tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist.strategies.parameter_server.closures import VarSpec
from nbdist.strategies.parameter_server.placement import Shard
from nbdist.variables import Variable, VariableAggregation, VariableSynchronization

__all__ = ["PSVariable", "ShardView"]


class ShardView:
    """One shard of a variable on a ps task: `name` (`NAME/part_i`), `shape`, `device`."""

    def __init__(self, owner: Any, shard: Shard, ps_id: int):
        self._owner = owner
        self._shard = shard
        self._ps_id = ps_id
        self.name = shard.name
        self.shape = torch.Size(shard.shape)
        self.device = shard.device
        self.ps = shard.ps

    def read_value(self) -> torch.Tensor:
        """The shard's current value (read from its ps task)."""
        return self._owner._strategy._client(self.ps).read([self._ps_id])[0]

    def numpy(self) -> Any:
        return self.read_value().numpy()

    def __repr__(self) -> str:
        return f"<ShardView {self.name!r} shape={list(self.shape)} on {self.device}>"


class PSVariable(Variable):
    """A variable held by the ps tasks (one shard or several); see the module docstring."""

    def __init__(self, strategy: Any, spec: VarSpec, shards: list[Shard], trainable: bool):
        self._strategy = strategy
        self._spec = spec
        self._shards = shards
        self._name = spec.name
        self._trainable = trainable
        self._synchronization = VariableSynchronization.ON_WRITE
        self._aggregation = VariableAggregation.NONE
        self._device = shards[0].device

    @property
    def variables(self) -> tuple[ShardView, ...]:
        """The shards in row order (one for an unsplit variable)."""
        return tuple(
            ShardView(self, shard, ps_id)
            for shard, (_, ps_id, _) in zip(self._shards, self._spec.shards)
        )

    @property
    def dtype(self) -> torch.dtype:
        return self._spec.dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._spec.shape)

    def _read(self) -> torch.Tensor:
        return self._strategy._read_spec(self._spec)

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
            self._strategy._assign_spec(self._spec, tensor)
        else:
            sign = 1 if method == "assign_add" else -1
            self._strategy._add_spec(self._spec, sign * tensor)
        return self

    def __repr__(self) -> str:
        where = ", ".join(shard.device for shard in self._shards)
        return f"<nbdist.PSVariable {self.name!r} shape={list(self.shape)} on {where}>"
