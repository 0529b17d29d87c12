"""Checkpoints of sharded state (`FullyShardedStrategy`) with torch.distributed.checkpoint (DCP).

Note [Sharded checkpoints]: a model sharded over N workers has no whole copy anywhere, so no
single worker can write it the way `nd.checkpoint.save` writes a mirrored model (one file, by
one worker). When any object given to `save` is sharded (a module whose parameters are
`DTensor`s, or an optimizer over them), the checkpoint is a DCP directory at `path` instead:
every worker writes its own shards of the modules and optimizers (`get_model_state_dict`,
`get_optimizer_state_dict`: keyed by parameter names, not by position), and the first worker
adds `nbdist.pt`, the header and the entries of every other object in `nd.checkpoint.save`'s
format. It is written under `path.partial` and renamed into place once DCP's collective save
is complete, so a reader sees the old checkpoint or the new one, never part of one.

DCP reshards on load, so the directory restores into any number of workers (2 → 3, 4 → 2)
and into a model that is not sharded at all (a mirrored strategy's, or a single process's:
each worker then reads the whole tensors). The other way, a file that
`nd.checkpoint.save` wrote from a mirrored model restores into a sharded one: each worker
cuts its shards out of the whole tensors (`set_model_state_dict(..., full_state_dict=True)`).

Example (on every worker)::

    nd.checkpoint.save("ckpt/step-100", model=model, optimizer=optimizer)   # a directory
    nd.checkpoint.restore("ckpt/step-100", model=model, optimizer=optimizer)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch

from nbdist.checkpoint.fileformat import load, payload, write_atomic
from nbdist.checkpoint.objects import apply, capture, check
from nbdist.errors import CheckpointError, CheckpointMismatchError, CheckpointTypeError

__all__ = [
    "SIDE_FILE",
    "apply_whole",
    "is_sharded_checkpoint",
    "is_sharded_object",
    "point_at_shards",
    "restore_sharded",
    "save_sharded",
]

SIDE_FILE = "nbdist.pt"
"""The file in a sharded checkpoint's directory with the header and the unsharded objects."""


def _is_dtensor(tensor: Any) -> bool:
    return hasattr(tensor, "to_local") and hasattr(tensor, "placements")


def _parameters(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.nn.Module):
        return list(obj.parameters())
    if isinstance(obj, torch.optim.Optimizer):
        from nbdist.strategies.fully_sharded import repoint_optimizer

        repoint_optimizer(obj)
        return [p for group in obj.param_groups for p in group["params"]]
    return []


def point_at_shards(objects: dict[str, Any]) -> None:
    """Point every optimizer among `objects` at the shards of parameters it was given whole
    (one created in the scope that sharded its model, not stepped yet), so that it is saved,
    checked and restored as the sharded optimizer it is."""
    if any(isinstance(o, torch.optim.Optimizer) for o in objects.values()):
        from nbdist.strategies.fully_sharded import repoint_optimizer

        for obj in objects.values():
            if isinstance(obj, torch.optim.Optimizer):
                repoint_optimizer(obj)


def is_sharded_object(obj: Any) -> bool:
    """True for a module with sharded parameters, or an optimizer over them.

    Example:
        >>> is_sharded_object(torch.nn.Linear(2, 2))
        False
    """
    return any(_is_dtensor(p) for p in _parameters(obj))


def is_sharded_checkpoint(where: str) -> bool:
    """True when `where` is a directory written by `save_sharded` (DCP's `.metadata` in it)."""
    return os.path.isdir(where) and os.path.exists(os.path.join(where, ".metadata"))


def _model_of(name: str, optimizer: torch.optim.Optimizer, objects: dict[str, Any]) -> Any:
    """The module among `objects` whose parameters `optimizer` steps (DCP names an optimizer's
    state by its model's parameter names)."""
    wanted = {id(p) for p in _parameters(optimizer)}
    for obj in objects.values():
        if isinstance(obj, torch.nn.Module) and wanted & {id(p) for p in obj.parameters()}:
            return obj
    raise CheckpointTypeError(
        f"Optimizer {name!r} steps sharded parameters, but no model holding them was given "
        "with it: a sharded optimizer's state is saved and restored by its model's parameter "
        f"names. Pass the model too: nd.checkpoint.save(path, model=model, {name}={name})."
    )


def _states(objects: dict[str, Any], sharded: list[str]) -> dict[str, Any]:
    """DCP's state dicts (sharded modules' and optimizers' `DTensor`s, or whole tensors)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    states: dict[str, Any] = {}
    for name in sharded:
        obj = objects[name]
        if isinstance(obj, torch.nn.Module):
            states[name] = get_model_state_dict(obj)
        else:
            states[name] = get_optimizer_state_dict(_model_of(name, obj, objects), obj)
    return states


def save_sharded(
    where: str,
    objects: dict[str, Any],
    workers: Any,
    *,
    metadata: dict[str, Any] | None = None,
    after_write: Callable[[Any], None] | None = None,
) -> str:
    """Save `objects` (some sharded) as a DCP directory at `where` (Note [Sharded
    checkpoints]); every worker calls it and returns once the directory is complete, or raises
    the same error."""
    import torch.distributed.checkpoint as dcp

    sharded = [n for n, o in objects.items() if isinstance(o, (torch.nn.Module,
               torch.optim.Optimizer))]  # fmt: skip
    partial = f"{where}.partial"
    error: BaseException | None = None
    try:
        states = _states(objects, sharded)
        entries = {n: capture(n, o) for n, o in objects.items() if n not in sharded}
        if workers.is_writer:
            shutil.rmtree(partial, ignore_errors=True)  # a save that died half-way
    except Exception as caught:
        error = caught
    workers.settle(error, f"Saving checkpoint {where!r}")
    error = None
    try:
        dcp.save(states, checkpoint_id=partial)
        if workers.is_writer:
            replicas = getattr(workers.strategy, "num_replicas_in_sync", 1)
            write_atomic(
                os.path.join(partial, SIDE_FILE),
                payload(entries, num_replicas_in_sync=replicas, num_workers=workers.count,
                        sharded={n: type(objects[n]).__name__ for n in sharded},
                        **(metadata or {})),
            )  # fmt: skip
            _replace(partial, where)
            if after_write is not None:
                after_write(workers)
    except Exception as caught:
        error = caught
    wrote = workers.is_writer and error is None
    workers.settle(error, f"Saving checkpoint {where!r}", wrote=wrote)
    return where


def _replace(partial: str, where: str) -> None:
    """Move the complete directory `partial` to `where`, replacing an older checkpoint."""
    if os.path.isfile(where):
        os.unlink(where)
    old = f"{where}.old"
    if os.path.isdir(where):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(where, old)
    os.replace(partial, where)
    shutil.rmtree(old, ignore_errors=True)


def restore_sharded(where: str, objects: dict[str, Any], workers: Any) -> dict[str, Any]:
    """Restore `objects` from the DCP directory `where`, into any number of workers, sharded
    or not; every object is checked before any changes. Returns the header."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    error: BaseException | None = None
    header: dict[str, Any] = {}
    states: dict[str, Any] = {}
    side: dict[str, Any] = {}
    try:
        data = load(os.path.join(where, SIDE_FILE))
        side = data["objects"]
        saved_sharded = data.get("sharded", {})
        header = {k: v for k, v in data.items() if k != "objects"}
        absent = [n for n in objects if n not in side and n not in saved_sharded]
        if absent:
            raise CheckpointMismatchError(
                f"Checkpoint {where!r} holds no {', '.join(map(repr, absent))}; it holds "
                f"{', '.join(map(repr, [*saved_sharded, *side])) or 'nothing'}. Restore each "
                "object under the name it was saved with."
            )
        for name, obj in objects.items():
            if name in side:
                check(name, obj, side[name], where)
        in_dcp = [n for n in objects if n in saved_sharded]
        states = _states(objects, in_dcp)
        _check_shapes(where, states, dcp.FileSystemReader(where).read_metadata())
    except Exception as caught:
        error = caught
    workers.settle(error, f"Restoring checkpoint {where!r}")
    error = None
    try:
        if states:
            dcp.load(states, checkpoint_id=where)
        for name, state in states.items():
            obj = objects[name]
            if isinstance(obj, torch.nn.Module):
                set_model_state_dict(obj, state)
            else:
                set_optimizer_state_dict(_model_of(name, obj, objects), obj, state)
        for name, obj in objects.items():
            if name in side:
                apply(obj, side[name])
    except Exception as caught:
        error = caught
    workers.settle(error, f"Restoring checkpoint {where!r}")
    return header


def _check_shapes(where: str, states: dict[str, Any], metadata: Any) -> None:
    """Refuse a checkpoint whose tensors are missing or of other shapes (another model)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = metadata.state_dict_metadata
    problems: list[str] = []

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                visit(f"{prefix}.{key}", item)
        elif isinstance(value, torch.Tensor) and value.dim() > 0:
            entry = saved.get(prefix)
            if entry is None:
                problems.append(f"{prefix} is not in the checkpoint")
            elif isinstance(entry, TensorStorageMetadata) and tuple(entry.size) != tuple(
                value.shape
            ):
                problems.append(f"{prefix} is {tuple(entry.size)} there, {tuple(value.shape)} "
                                "here")  # fmt: skip

    for name, state in states.items():
        visit(name, state)
    if problems:
        shown = "; ".join(problems[:4]) + ("; ..." if len(problems) > 4 else "")
        raise CheckpointMismatchError(
            f"Checkpoint {where!r} does not fit: {shown}. Restore it into the model (and "
            "optimizer) it was saved from; the number of workers may differ."
        )


def apply_whole(obj: Any, entry: dict[str, Any], objects: dict[str, Any]) -> None:
    """Restore a whole-tensor entry of `nd.checkpoint.save`'s file (saved from a mirrored
    model) into a sharded module or optimizer: each worker keeps its shards of it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    whole = StateDictOptions(full_state_dict=True)
    state = entry["state"]
    if isinstance(obj, torch.nn.Module):
        set_model_state_dict(obj, state, options=whole)
        return
    model = _model_of("optimizer", obj, objects)
    set_optimizer_state_dict(model, obj, _by_names(model, obj, state), options=whole)


def _by_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """`optimizer.state_dict()`-style `state` (parameters by position) keyed by the model's
    parameter names instead, as `set_optimizer_state_dict` takes it."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [p for group in optimizer.param_groups for p in group["params"]]
    if len(order) != sum(len(g["params"]) for g in state["param_groups"]):
        raise CheckpointMismatchError(
            "The optimizer's parameters differ from the checkpoint's: restore it into the "
            "optimizer it was saved from."
        )
    fqn = [names[id(p)] for p in order]
    by_position: dict[int, str] = {}
    groups = []
    position = 0
    for group in state["param_groups"]:
        params = []
        for index in group["params"]:
            by_position[index] = fqn[position]
            params.append(fqn[position])
            position += 1
        groups.append({**group, "params": params})
    return {
        "state": {by_position[i]: value for i, value in state["state"].items()},
        "param_groups": groups,
    }


def unsupported_read(where: str) -> CheckpointError:
    """The error for `nd.checkpoint.read` of a sharded checkpoint."""
    return CheckpointError(
        f"Checkpoint {where!r} is sharded (a directory of torch.distributed.checkpoint shards): "
        "its tensors are in no single file to read. Restore it into a model with "
        "nd.checkpoint.restore (on any number of workers, or in one process)."
    )
