"""This process's live multi-worker strategies (those with a process group), and the global
torch hooks that find a parameter's strategy among them: count optimizer steps for the replica
check (Note [Replica check]) and refuse `DistributedDataParallel` of a model created in scope
(Note [Backward outside run], both in `nbdist.strategies.multi_worker`).

Registered once per process (torch's hooks are global); each looks up the strategy through its
public `owns_parameters` and `count_optimizer_step`. Imports no other strategy module, so
`multi_worker` imports this one, not the other way round.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from nbdist.errors import RedundantDDPError

__all__ = ["install_hooks", "is_live", "live_multi_worker_strategy", "register", "unregister"]

# id -> a MultiWorkerMirroredStrategy with a process group, in order of creation
_live: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def live_multi_worker_strategy() -> Any | None:
    """This process's multi-worker strategy with a process group (the last made), if any.

    Used where every worker must take part but no strategy is current, e.g. a checkpoint saved
    in a `%%distribute` cell outside `strategy.scope()`.

    Example:
        >>> live_multi_worker_strategy() is None  # no multi-worker strategy in this process
        True
    """
    strategies = list(_live.values())
    return strategies[-1] if strategies else None


def register(strategy: Any) -> None:
    """Count `strategy` (a multi-worker strategy that formed a group) as live."""
    _live[id(strategy)] = strategy


def unregister(strategy: Any) -> None:
    """`strategy` was shut down: no longer live."""
    _live.pop(id(strategy), None)


def is_live(strategy: Any) -> bool:
    """True from `register(strategy)` until `unregister(strategy)`."""
    return _live.get(id(strategy)) is strategy


def install_hooks(check_outside_scope: Callable[[torch.optim.Optimizer, Any, Any], None]) -> None:
    """Register the global hooks once per process: `check_outside_scope` before every optimizer
    step, the step count after it, and the `DistributedDataParallel` refusal."""
    from torch.nn.modules.module import register_module_module_registration_hook
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    if not _outside_scope_hook:
        _outside_scope_hook.append(register_optimizer_step_pre_hook(check_outside_scope))
        _outside_scope_hook.append(register_optimizer_step_post_hook(_count_step))
        _outside_scope_hook.append(register_module_module_registration_hook(_refuse_ddp))


_owner: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, Any]] = (
    weakref.WeakKeyDictionary()
)  # optimizer -> (number of its parameters when looked up, weak ref to its strategy or None)


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """After each optimizer step over mirrored parameters, in `run` or not: count it and run
    the replica check every `replica_check_every` steps (Note [Replica check])."""
    if torch.compiler.is_compiling():
        return
    count = sum(len(group["params"]) for group in optimizer.param_groups)
    known = _owner.get(optimizer)
    if known is None or known[0] != count:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        found = next((s for s in _live.values() if s.owns_parameters(params)), None)
        known = (count, weakref.ref(found) if found is not None else None)
        _owner[optimizer] = known
    strategy = known[1]() if known[1] is not None else None
    if strategy is not None:
        strategy.count_optimizer_step()


def _refuse_ddp(module: torch.nn.Module, name: str, submodule: Any) -> None:
    """Refuse `DistributedDataParallel(model)` of a model whose parameters were created in a
    multi-worker scope: their gradients are already averaged (Note [Backward outside run])."""
    ddp = sys.modules.get("torch.nn.parallel.distributed")  # not imported: no DDP to refuse
    if submodule is None or ddp is None or not isinstance(module, ddp.DistributedDataParallel):
        return
    params = list(submodule.parameters())
    if any(s.owns_parameters(params) for s in list(_live.values())):
        raise RedundantDDPError(
            "DistributedDataParallel(model) wraps a model created in strategy.scope(): nbdist "
            "already averages its gradients across the workers in every backward (inside "
            "strategy.run and outside it), so DDP would synchronise them a second time. Drop "
            "the wrapper: train `model` itself (model(x), model.parameters(), "
            "model.state_dict())."
        )


_outside_scope_hook: list[Any] = []
