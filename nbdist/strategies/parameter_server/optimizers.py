"""Optimizer state on the ps tasks: an optimizer of the strategy's parameters keeps its state
(momentum, RMSprop's averages, Adam's moments and step) across scheduled functions.

TF keeps an optimizer's slot variables with their variables on the ps tasks. Here the chief's
optimizer travels to the worker as a reference (`OptimizerRef`: its class and `__getstate__`,
hyper-parameters included, so a learning rate changed on the chief applies to the next
function); the worker rebuilds it over its copies of the parameters, loads each parameter's
state from the ps task(s) holding that parameter (`load`), runs the function, and sends back
what the step changed (`store`): the difference for a slot that existed, the whole state for
a parameter stepped for the first time (created only if no other worker created it first).
A state tensor shaped like a split parameter is split like it; any other (the step count) is
kept whole with every shard.

Example (what the chief writes; the rest happens on the workers)::

    with strategy.scope():
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01)
    def step(x, y):
        optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    coordinator.schedule(step, args=(x, y))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from nbdist.errors import InvalidArgumentError
from nbdist.strategies.parameter_server.closures import VarSpec

__all__ = ["OptimizerRef", "WorkerOptimizer", "load", "store"]


@dataclasses.dataclass
class OptimizerRef:
    """What travels for a chief's optimizer: its id, class and pickled state (parameters in
    it travel as references, so they arrive as the worker's copies)."""

    oid: int
    cls: type
    state: dict[str, Any]


@dataclasses.dataclass
class WorkerOptimizer:
    """A chief's optimizer rebuilt on a worker, with the state read from the ps tasks."""

    oid: int
    optimizer: torch.optim.Optimizer
    params: list[tuple[Any, VarSpec]]
    before: dict[int, dict[str, list[torch.Tensor]]] = dataclasses.field(default_factory=dict)
    """Per parameter (its VarSpec vid): each slot's per-shard values as read."""


def rebuild(ref: OptimizerRef, specs: dict[int, VarSpec]) -> WorkerOptimizer:
    """The optimizer `ref` describes, over this worker's parameter copies (`specs`: id of a
    copy -> its VarSpec)."""
    optimizer = ref.cls.__new__(ref.cls)
    optimizer.__setstate__(dict(ref.state))
    params = [
        (param, specs[id(param)])
        for group in optimizer.param_groups
        for param in group["params"]
        if id(param) in specs
    ]
    return WorkerOptimizer(ref.oid, optimizer, params)


def _split(value: torch.Tensor, spec: VarSpec) -> list[torch.Tensor]:
    """Per shard: rows of a state shaped like the (split) parameter, else the whole value."""
    if len(spec.shards) > 1 and tuple(value.shape) == tuple(spec.shape):
        parts, row = [], 0
        for _, _, rows in spec.shards:
            parts.append(value[row : row + rows])
            row += rows
        return parts
    return [value] * len(spec.shards)


def _join(parts: list[torch.Tensor], spec: VarSpec) -> torch.Tensor:
    """The whole value of a slot from its per-shard values (see `_split`)."""
    rows = [rows for _, _, rows in spec.shards]
    split = len(parts) > 1 and all(
        part.dim() and part.shape[0] == count and tuple(part.shape[1:]) == spec.shape[1:]
        for part, count in zip(parts, rows)
    )
    return torch.cat(parts, 0) if split else parts[0].clone()


def load(opt: WorkerOptimizer, client: Any) -> bool:
    """Read every parameter's slots from its ps task(s) into `opt.optimizer.state`
    (`client(ps)` gives the connection to ps task `ps`); one request per ps task. True when
    every parameter had its state there."""
    wanted: dict[int, list[tuple[int, int]]] = {}
    for _, spec in opt.params:
        for ps, shard, _ in spec.shards:
            wanted.setdefault(ps, []).append((shard, opt.oid))
    found: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for ps, keys in wanted.items():
        for key, slots in zip(keys, client(ps).read_slots(keys)):
            found[key] = slots
    complete = True
    for param, spec in opt.params:
        per_shard = [found.get((shard, opt.oid), {}) for _, shard, _ in spec.shards]
        names = list(per_shard[0])
        if not names:
            opt.before[spec.vid] = {}
            complete = False
            continue  # never stepped: the optimizer creates its state as usual
        opt.before[spec.vid] = {name: [slots[name] for slots in per_shard] for name in names}
        state = opt.optimizer.state[param]
        state.clear()
        for name in names:
            state[name] = _join(opt.before[spec.vid][name], spec)
    return complete


def store(opt: WorkerOptimizer, client: Any, overwrite: bool = False) -> None:
    """Send what the function changed in the optimizer's state to the ps tasks (with
    `overwrite`, the whole state, replacing what the ps tasks hold: `strategy.push`)."""
    writes: dict[int, tuple[list[tuple[int, int, str, str]], list[torch.Tensor]]] = {}
    cls = type(opt.optimizer).__name__
    for param, spec in opt.params:
        state = opt.optimizer.state.get(param)
        if not state:
            continue
        before = opt.before.get(spec.vid, {})
        for name, value in state.items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise InvalidArgumentError(
                    f"{cls}'s state {name!r} is a {type(value).__name__}, not a tensor: a "
                    "ParameterServerStrategy keeps an optimizer's tensor state on the ps tasks "
                    "only. Create this optimizer inside the scheduled function (its state then "
                    "lasts one function), or use one whose state is tensors (SGD, Adam, RMSprop)."
                )
            parts = _split(value.detach(), spec)
            old = before.get(name)
            for i, ((ps, shard, _), part) in enumerate(zip(spec.shards, parts)):
                entries, tensors = writes.setdefault(ps, ([], []))
                if overwrite:
                    entries.append((shard, opt.oid, name, "set"))
                    tensors.append(part.clone())
                elif old is None:
                    entries.append((shard, opt.oid, name, "init"))
                    tensors.append(part.clone())
                elif not torch.equal(part, old[i]):
                    entries.append((shard, opt.oid, name, "add"))
                    tensors.append(part - old[i])
    for ps, (entries, tensors) in writes.items():
        if entries:
            client(ps).write_slots(entries, tensors)
