"""Which modules of a model become FSDP units: the `shard` policy of `FullyShardedStrategy`.

A unit is a module whose parameters are gathered together for its forward and backward and
freed after (FSDP2's `fully_shard` on that module). The root of every model is always a unit,
so that every parameter is sharded; the policy chooses the units inside it:

- `"auto"`: bottom-up, the smallest subtrees that hold at least `min_shard_bytes` of parameters
  not already in a unit below them (FSDP1's size-based wrap policy, counted in bytes as TF's
  `MinSizePartitioner` counts them). A model of blocks gets one unit per block once each
  block reaches the threshold; when no subtree reaches it, the root's children that hold
  parameters (its blocks) become the units, so a small model is still gathered block by block.
- a callable `module -> bool`: the modules it returns True for (the root is asked too, and is
  a unit anyway).

Note [Tied parameters]: a parameter registered in two subtrees (a tied embedding and output
layer, a weight shared by two blocks) can belong to one unit only, or the two units would each
shard it and step it twice. "auto" never chooses a module whose subtree shares a parameter with
the rest of the model, so a tied parameter lands in the smallest unit that holds both uses (the
root at worst: FSDP2's own advice for tied embeddings). A callable that chooses such a module
gets an `InvalidArgumentError` naming the parameter and both owners.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
    ...                             torch.nn.Linear(64, 64))
    >>> [type(m).__name__ for m in choose_units(model, "auto", min_shard_bytes=1024)]
    ['Linear', 'Linear', 'Sequential']
    >>> [type(m).__name__ for m in choose_units(model, "auto", min_shard_bytes=1 << 20)]
    ['Linear', 'Linear', 'Sequential']
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nbdist.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["ShardPolicy", "check_policy", "choose_units"]

ShardPolicy = str | Callable[[torch.nn.Module], bool]
"""`"auto"` or a callable `module -> bool` (see the module docstring)."""


def check_policy(shard: object, min_shard_bytes: object) -> None:
    """Refuse a policy or threshold `FullyShardedStrategy` cannot use, naming what it accepts."""
    if not (shard == "auto" or callable(shard)):
        raise ArgumentTypeError(
            f"shard must be 'auto' or a callable module -> bool, got {shard!r}. "
            "E.g. shard=lambda m: isinstance(m, Block)."
        )
    if isinstance(min_shard_bytes, bool) or not isinstance(min_shard_bytes, int):
        raise ArgumentTypeError(
            f"min_shard_bytes must be an int number of bytes, got {min_shard_bytes!r}."
        )
    if min_shard_bytes < 0:
        raise InvalidArgumentError(
            f"min_shard_bytes must be >= 0, got {min_shard_bytes}. Use 0 to make every "
            "module with parameters a unit."
        )


def choose_units(
    root: torch.nn.Module, shard: ShardPolicy, *, min_shard_bytes: int
) -> list[torch.nn.Module]:
    """The units of `root`, children before parents (the order `fully_shard` needs), `root`
    last.

    Raises:
        InvalidArgumentError: a callable policy chose a module that shares a parameter with
            the rest of the model (Note [Tied parameters]).
    """
    total = _uses(root)
    units: list[torch.nn.Module] = []
    in_unit: set[int] = set()  # parameter ids already in a unit below
    for name, module in _post_order(root):
        if module is root:
            break
        uses = _uses(module)
        if not uses:
            continue
        tied = [p for p, n in uses.values() if n != total[id(p)][1]]
        if shard == "auto":
            if tied:
                continue
            free = sum(p.numel() * p.element_size() for p in module.parameters()
                       if id(p) not in in_unit)  # fmt: skip
            if free < min_shard_bytes or free == 0:
                continue
        elif not shard(module):
            continue
        elif tied:
            raise InvalidArgumentError(
                f"The shard policy chose {name!r} ({type(module).__name__}), but its parameter "
                f"{_param_name(root, tied[0])!r} is also used outside it (a tied parameter), so "
                "two units would each shard it. Choose a module that holds every use of it (a "
                "common parent), or leave both owners out (the root then holds it)."
            )
        units.append(module)
        in_unit.update(id(p) for p in module.parameters())
    if shard == "auto" and not units:  # nothing reached the size: the root's blocks
        units = [child for child in _distinct_children(root)
                 if _uses(child) and not _is_tied(child, total)]  # fmt: skip
        if len(units) < 2:
            units = []
    units.append(root)
    return units


def _distinct_children(root: torch.nn.Module) -> list[torch.nn.Module]:
    seen: set[int] = set()
    out = []
    for child in root.children():
        if id(child) not in seen:
            seen.add(id(child))
            out.append(child)
    return out


def _is_tied(module: torch.nn.Module, total: dict) -> bool:
    return any(n != total[id(p)][1] for p, n in _uses(module).values())


def _post_order(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """`(name, module)` of every distinct module under `root`, children first, `root` last."""
    out: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()

    def visit(name: str, module: torch.nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        out.append((name, module))

    visit("", root)
    return out


def _uses(module: torch.nn.Module) -> dict[int, tuple[torch.Tensor, int]]:
    """`id(parameter) -> (parameter, how many times it is registered under module)` (keyed
    by id: tensors compare elementwise, so they cannot be dictionary keys themselves)."""
    counts: dict[int, tuple[torch.Tensor, int]] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = (p, counts.get(id(p), (p, 0))[1] + 1)
    return counts


def _param_name(root: torch.nn.Module, param: torch.Tensor) -> str:
    names = [n for n, p in root.named_parameters(remove_duplicate=False) if p is param]
    return " = ".join(names) if names else "a parameter"
