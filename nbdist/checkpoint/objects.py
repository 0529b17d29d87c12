"""What a checkpoint stores for each kind of object, and how it checks and restores it.

Each object given to `nd.checkpoint.save` becomes one entry `{"kind", "type", "state"}`:

| kind | objects | state | restored with |
|---|---|---|---|
| `variable` | `nd.Variable` (mirrored, sync-on-read, plain) | `{"value": tensor}`, the
  cross-replica value (a sync-on-read variable's aggregate) | `load_state_dict` (assign) |
| `module` | `torch.nn.Module` | `state_dict()` | `load_state_dict` |
| `optimizer` | `torch.optim.Optimizer` | `state_dict()` | `load_state_dict` |
| `iterator` | `nd.DistributedIterator` | its position | `load_state_dict` |
| `tensor` | `torch.Tensor` | a copy | `copy_` in place |
| `generator` | `torch.Generator` | `get_state()` | `set_state` |
| `dict` | a `dict` of plain values | a copy | cleared and updated in place |
| `stateful` | anything else with `state_dict`/`load_state_dict` (LR schedulers, GradScaler) |
  `state_dict()` | `load_state_dict` |

`check` runs before anything is restored, so an entry that does not fit (another model's
parameters, an optimizer of other parameter groups) changes nothing. Imports nbdist.errors,
nbdist.input and nbdist.core.variables.

Example:
    >>> entry = capture("w", torch.zeros(2))
    >>> entry["kind"], entry["state"]
    ('tensor', tensor([0., 0.]))
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist.core.variables import Variable
from nbdist.errors import CheckpointMismatchError, CheckpointTypeError
from nbdist.input import DistributedDataset, DistributedIterator

__all__ = ["apply", "capture", "check", "kind_of"]

_SHOWN = 4  # differences listed in a mismatch message


def kind_of(name: str, obj: Any) -> str:
    """The entry kind for `obj`.

    Raises:
        CheckpointTypeError: `obj` cannot be checkpointed (the message says what can).
    """
    if isinstance(obj, Variable):
        return "variable"
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, DistributedIterator):
        return "iterator"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, torch.Generator):
        return "generator"
    if isinstance(obj, DistributedDataset):
        raise CheckpointTypeError(
            f"{name}= is a distributed dataset, which has no position; checkpoint the iterator "
            f"you take steps from: it = iter(dataset); ...; nd.checkpoint.save(path, {name}=it)."
        )
    if isinstance(obj, dict):
        return "dict"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "stateful"
    raise CheckpointTypeError(
        f"{name}= is a {type(obj).__name__}, which nd.checkpoint cannot save or restore in "
        f"place. Give modules, optimizers, nd.Variables, tensors, torch.Generators, distributed "
        f"iterators, dicts of plain values, or objects with state_dict() and load_state_dict()"
        f"; keep plain numbers in a dict (e.g. progress={{'epoch': 3}})."
    )


def capture(name: str, obj: Any) -> dict[str, Any]:
    """The entry saved for `obj`: its kind, type name and state (tensors detached)."""
    kind = kind_of(name, obj)
    if kind == "tensor":
        state: Any = obj.detach().clone()
    elif kind == "generator":
        state = obj.get_state()
    elif kind == "dict":
        state = dict(obj)
    else:
        state = obj.state_dict()
    if kind not in ("tensor", "generator"):
        _check_loadable(state, name)
    return {"kind": kind, "type": _type_name(obj), "state": state}


_PLAIN = frozenset({int, float, bool, complex, str, bytes, bytearray, type(None)})
_TORCH = (torch.Tensor, torch.dtype, torch.device)


def _check_loadable(value: Any, where: str) -> None:
    """Refuse, at save time, a value `torch.load(weights_only=True)` would not read back
    (numpy scalars and arrays, functions, other objects): better now than at restore."""
    if type(value) in _PLAIN or isinstance(value, _TORCH):  # exact: numpy.float64 is a float
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_loadable(key, f"{where} key {key!r}")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple, set, frozenset)):  # torch.Size is a tuple
        for index, item in enumerate(value):
            _check_loadable(item, f"{where}[{index}]")
        return
    kind = type(value)
    raise CheckpointTypeError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}, which a checkpoint cannot hold: "
        f"checkpoints keep tensors and plain Python values (numbers, strings, lists, dicts) "
        f"so that restoring one runs no code. Convert it first, e.g. float(x) or int(x) for a "
        f"numpy number, torch.as_tensor(x) for an array."
    )


def check(name: str, obj: Any, entry: dict[str, Any], path: str) -> None:
    """Raise `CheckpointMismatchError` if `entry` does not fit `obj`; changes nothing."""
    kind = kind_of(name, obj)
    if entry.get("kind") != kind:
        raise CheckpointMismatchError(
            f"Checkpoint {path!r} holds {name!r} as a {entry.get('kind')} "
            f"({entry.get('type')}), but {name}= is a {kind} ({_type_name(obj)}); give the "
            f"object of the kind that was saved under that name."
        )
    state = entry["state"]
    if kind == "module":
        _check_module(name, obj, state, path, entry.get("type"))
    elif kind == "optimizer":
        _check_optimizer(name, obj, state, path, entry.get("type"))
    elif kind == "variable":
        _check_shape(name, "nd.Variable", tuple(obj.shape), state["value"], path)
    elif kind == "tensor":
        _check_shape(name, "tensor", tuple(obj.shape), state, path)
    elif kind == "iterator":
        if obj.position is None:
            obj.state_dict()  # raises the error for an iterator without a position
        else:
            obj.position.resume_from(state)
    elif kind == "stateful" and entry.get("type") != _type_name(obj):
        raise CheckpointMismatchError(
            f"Checkpoint {path!r} holds {name!r} as a {entry.get('type')}, but {name}= is a "
            f"{_type_name(obj)}; restore it into an object of the type that was saved."
        )


def apply(obj: Any, entry: dict[str, Any]) -> None:
    """Restore `entry` (checked by `check`) into `obj` in place."""
    kind, state = entry["kind"], entry["state"]
    if kind == "tensor":
        with torch.no_grad():
            obj.copy_(state)
    elif kind == "generator":
        obj.set_state(state)
    elif kind == "dict":
        obj.clear()
        obj.update(state)
    else:
        obj.load_state_dict(state)


# --- checks --------------------------------------------------------------------------------


def _check_module(name: str, module: Any, saved: Any, path: str, saved_type: Any) -> None:
    current = module.state_dict()
    shapes = {k: tuple(v.shape) for k, v in saved.items() if isinstance(v, torch.Tensor)}
    here = {k: tuple(v.shape) for k, v in current.items() if isinstance(v, torch.Tensor)}
    problems = []
    missing = [k for k in here if k not in shapes]
    unexpected = [k for k in shapes if k not in here]
    differ = [k for k in here if k in shapes and here[k] != shapes[k]]
    if missing:
        problems.append(f"{name}= has {_listed(missing)} that the checkpoint lacks")
    if unexpected:
        problems.append(f"the checkpoint has {_listed(unexpected)} that {name}= lacks")
    if differ:
        shown = ", ".join(
            f"{k} {list(shapes[k])} saved vs {list(here[k])} here" for k in differ[:_SHOWN]
        )
        more = f" and {len(differ) - _SHOWN} more" if len(differ) > _SHOWN else ""
        problems.append(f"shapes differ: {shown}{more}")
    if problems:
        raise CheckpointMismatchError(
            f"Checkpoint {path!r} holds parameters for a model with {_summary(shapes)} "
            f"({saved_type}), but {name}= ({_type_name(module)}) has {_summary(here)}: "
            f"{'; '.join(problems)}. Restore it into the model it was saved from (the same "
            f"layers and sizes), or read its tensors with nd.checkpoint.read({path!r})."
        )


def _check_optimizer(name: str, optimizer: Any, saved: Any, path: str, saved_type: Any) -> None:
    here_type = _type_name(optimizer)
    groups = [len(g["params"]) for g in optimizer.param_groups]
    saved_groups = [len(g["params"]) for g in saved.get("param_groups", [])]
    problem = None
    if saved_type != here_type:
        problem = f"it was saved from a {saved_type}, {name}= is a {here_type}"
    elif groups != saved_groups:
        problem = f"it holds {_count(saved_groups)}, {name}= optimizes {_count(groups)}"
    else:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        ids = [i for g in saved["param_groups"] for i in g["params"]]
        for param, key in zip(params, ids):
            for field, value in saved.get("state", {}).get(key, {}).items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and tuple(value.shape) != tuple(param.shape)
                ):
                    problem = (
                        f"its {field!r} for parameter {key} has shape {list(value.shape)}, "
                        f"the parameter {name}= optimizes there has {list(param.shape)}"
                    )
                    break
            if problem:
                break
    if problem:
        raise CheckpointMismatchError(
            f"Checkpoint {path!r} holds an optimizer state that does not fit {name}=: "
            f"{problem}. Restore it into the optimizer of the model it was saved from (same "
            f"type, created over the same parameters in the same order)."
        )


def _check_shape(name: str, what: str, shape: tuple, saved: Any, path: str) -> None:
    saved_shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else None
    if saved_shape != shape:
        raise CheckpointMismatchError(
            f"Checkpoint {path!r} holds {name!r} with shape {list(saved_shape or ())}, but "
            f"{name}= is a {what} of shape {list(shape)}; restore it into the {what} it was "
            f"saved from."
        )


def _summary(shapes: dict[str, tuple]) -> str:
    values = sum(int(torch.Size(s).numel()) for s in shapes.values())
    return f"{len(shapes)} tensors ({values:,} values)"


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return f"{'tensor' if len(keys) == 1 else 'tensors'} {shown}{more}"


def _count(groups: list[int]) -> str:
    sizes = ", ".join(map(str, groups))
    return f"{len(groups)} parameter group(s) of {sizes} parameter(s)"


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
