"""Module parameters and buffers captured in an in-process strategy's scope, one copy a replica.

Note [Replica views]: a parameter `P` created in `scope()` gets one component per replica
(MirroredStrategy: `P` itself for replica 0 and a copy for each other device; CentralStorage:
a view of `P` for each compute device). Inside `run`, a thread-local `TorchFunctionMode` swaps
`P` for the replica's component in every torch call, so the user's one `model` computes with the
replica's own tensors. After `backward()` the replicas' gradients are averaged in one batched
reduction (CentralStorage's parameters get the average there too, while every replica waits in
that exchange); `optimizer.step()` on a replica runs a shadow optimizer over that replica's
components (CentralStorage: only replica 0 steps the real parameters, the others wait).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.overrides import TorchFunctionMode

from nbdist._private_api import queue_backward_callback, tensor_version
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.op import ReduceOp
from nbdist.strategies._compiled import eager_between_graphs

if TYPE_CHECKING:
    from nbdist.collectives.local import LocalGroup

__all__ = ["ReplicaParameters"]

_hooks_lock = threading.Lock()
_hooks_installed: list[bool] = [False]


# Each captured tensor carries its slot in its strategy's lists under this attribute. The view
# finds a tensor's components through it (checked with `is`, so a copy of the tensor is never
# swapped), not through `id()`: under torch.compile an `id()` of the step's input tensors would
# make Dynamo guard on their identity and recompile at every batch.
_SLOT = "_nbdist_replica_slot"


class _ReplicaView(TorchFunctionMode):
    """Swap captured tensors for this replica's components in every torch call.

    Traceable by torch.compile (see Note [Replica views] and docs/compile.md): the compiled
    graph reads the replica's own components as its inputs.
    """

    def __init__(self, replicas: ReplicaParameters, replica: int):
        super().__init__()
        self.originals = replicas.originals
        self.components = replicas.components
        self.replica = replica

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Under torch.compile the check is skipped (Dynamo cannot read a ContextVar): a compiled
        # region is always in replica context, since merge_call graph-breaks out of it.
        if torch.compiler.is_compiling() or context.current_replica_context() is not None:
            args = self._swap(args)
            if kwargs:
                kwargs = dict(zip(kwargs, self._swap(tuple(kwargs.values()))))
        return func(*args, **(kwargs or {}))

    def _swap(self, items: tuple | list) -> Any:
        replaced = None
        for index, item in enumerate(items):
            if isinstance(item, torch.Tensor):
                new = self._component(item)
            elif type(item) in (list, tuple):
                new = self._swap(item)
            else:
                continue
            if new is not item:
                if replaced is None:
                    replaced = list(items)
                replaced[index] = new
        if replaced is None:
            return items
        return tuple(replaced) if isinstance(items, tuple) else replaced

    def _component(self, tensor: torch.Tensor) -> torch.Tensor:
        slot = getattr(tensor, _SLOT, None)
        if slot is None or slot >= len(self.originals) or self.originals[slot] is not tensor:
            return tensor
        components = self.components[slot]
        return components[self.replica] if components else tensor


class ReplicaParameters:
    """The replica components of every parameter and buffer captured by one strategy."""

    def __init__(self, devices: tuple[str, ...], *, central: bool, group: LocalGroup):
        self.devices = devices
        self.central = central
        self.group = group
        self._originals: list[torch.Tensor] = []
        self._synced: list[bool] = []  # average this parameter's gradients?
        self._index: dict[int, int] = {}
        self._components: list[list[torch.Tensor]] = []
        self._aliases: list[list[bool]] = []
        self._versions: list[int] = []
        self._maps: list[dict[int, torch.Tensor]] = [{} for _ in devices]
        self._views: dict[int, _ReplicaView] = {}
        self._pending = [False] * len(devices)
        self._shadows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # shadow optimizer -> the `state` of the optimizer it was copied from
        self._shadow_sources: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._shadow_lock = threading.Lock()
        self.active = False

    @property
    def originals(self) -> list[torch.Tensor]:
        """The captured tensors (parameters and buffers created in scope), in capture order."""
        return self._originals

    @property
    def components(self) -> list[list[torch.Tensor]]:
        """Each captured tensor's per-replica components (replica 0 first; empty until the
        first sync makes them)."""
        return self._components

    # -- capture and broadcast ------------------------------------------------------------
    def capture(self, tensor: torch.Tensor | None, *, sync_gradients: bool) -> None:
        """Own `tensor` (a parameter or buffer created in scope); components come at sync."""
        if tensor is None or id(tensor) in self._index:
            return
        self._index[id(tensor)] = len(self._originals)
        setattr(tensor, _SLOT, len(self._originals))
        self._originals.append(tensor)
        self._synced.append(sync_gradients and isinstance(tensor, torch.nn.Parameter))
        self._components.append([])
        self._aliases.append([])
        self._versions.append(-1)
        _install_optimizer_hooks()

    def owns(self, tensor: torch.Tensor) -> bool:
        """True when `tensor` was captured by this strategy."""
        return id(tensor) in self._index

    def synchronize(self) -> None:
        """Broadcast every captured tensor changed outside a training step to all replicas.

        A parameter changed outside `run` (an `optimizer.step()` in the cross-replica context,
        `load_state_dict`) may come with optimizer state changed there too (momentum): the
        replicas' shadow optimizers are then made again from the optimizer's state, as replica
        0's parameters are copied, or the other replicas would step from their old state and
        drift apart.
        """
        for i, original in enumerate(self._originals):
            if not self._components[i]:
                self._create_components(i, original)
            elif tensor_version(original) != self._versions[i]:
                if self._synced[i]:
                    with self._shadow_lock:
                        self._shadows.clear()
                with torch.no_grad():
                    for k, component in enumerate(self._components[i]):
                        if component is not original and not self._aliases[i][k]:
                            component.copy_(original)
                self._versions[i] = tensor_version(original)
            if original.grad is None:
                for component in self._components[i]:
                    component.grad = None

    def _create_components(self, i: int, original: torch.Tensor) -> None:
        is_param = isinstance(original, torch.nn.Parameter)
        components, aliases = [], []
        for k, device in enumerate(self.devices):
            target = physical_device(device)
            if (not self.central and k == 0) or (not is_param and k == 0):
                component, alias = original, False
            elif self.central and is_param and original.device == target:
                component, alias = original.detach(), True
            else:
                component, alias = original.detach().to(target, copy=True), False
            if is_param and component is not original:
                component.requires_grad_(original.requires_grad)
            if is_param and component.requires_grad and self._synced[i]:
                component.register_post_accumulate_grad_hook(functools.partial(self._on_grad, k))
            components.append(component)
            aliases.append(alias)
            if component is not original:
                self._maps[k][id(original)] = component
        self._components[i], self._aliases[i] = components, aliases
        self._versions[i] = tensor_version(original)

    def view(self, replica: int) -> TorchFunctionMode | None:
        """The mode that makes `replica` compute with its own components (None: not needed)."""
        mapping = self._maps[replica]
        if not mapping:
            return None
        # One mode object per replica, reused at every `run`: torch.compile guards on the mode
        # stack, so a fresh object each step would recompile each step.
        mode = self._views.get(replica)
        if mode is None:
            mode = self._views[replica] = _ReplicaView(self, replica)
        return mode

    # -- gradients ------------------------------------------------------------------------
    @eager_between_graphs
    def _on_grad(self, replica: int, tensor: torch.Tensor) -> None:
        if not self.active or self._pending[replica]:
            return
        self._pending[replica] = True
        queue_backward_callback(functools.partial(self._end_of_backward, replica))

    @eager_between_graphs
    def _end_of_backward(self, replica: int) -> None:
        self._pending[replica] = False
        grads = [
            comps[replica].grad if synced else None
            for comps, synced in zip(self._components, self._synced)
        ]
        nbytes = sum(g.numel() * g.element_size() for g in grads if g is not None)
        self.group.exchange(
            replica, "gradient_sync", grads, combine=self._average, nbytes=nbytes,
            implementation="local",
        )  # fmt: skip

    def _average(self, per_replica: list[list[torch.Tensor | None]]) -> None:
        """Average every synced gradient over the replicas and write it to each replica."""
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, synced in enumerate(self._synced):
            grads = [p[i] for p in per_replica]
            present = [g for g in grads if g is not None]
            if not synced or not present:
                continue
            for r, g in enumerate(grads):
                if g is None:
                    per_replica[r][i] = torch.zeros_like(present[0])
            by_dtype.setdefault(present[0].dtype, []).append(i)
        first_device = physical_device(self.devices[0])
        for indices in by_dtype.values():
            flats = [
                torch.cat([per_replica[r][i].reshape(-1) for i in indices]).to(first_device)
                for r in range(len(self.devices))
            ]
            mean = ReduceOp.MEAN.combine(flats)
            pieces = torch.split(mean, [per_replica[0][i].numel() for i in indices])
            for i, piece in zip(indices, pieces):
                for r, component in enumerate(self._components[i]):
                    value = piece.view_as(per_replica[r][i])
                    if component.grad is None:
                        component.grad = value.to(component.device, copy=True)
                    else:
                        component.grad.copy_(value)
                if self.central:
                    self._publish_central_gradient(i)

    def _publish_central_gradient(self, i: int) -> None:
        """Give CentralStorage's parameter `i` the averaged gradient while every replica waits
        in the gradient exchange: written only at `optimizer.step`, its `.grad` went from None
        to a tensor under replicas still running (or compiling, and so guarding on it:
        docs/compile.md) code that reads it. On the compute device it is replica 0's gradient
        itself; on another device a copy is made here only the first time (`before_step`
        refreshes it at each step, so a backward costs no extra transfer)."""
        original, grad = self._originals[i], self._components[i][0].grad
        if grad is None or original.grad is grad:
            return
        if grad.device == original.device:
            original.grad = grad
        elif original.grad is None:
            original.grad = grad.to(original.device)

    # -- optimizer ------------------------------------------------------------------------
    def owns_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """True when the optimizer trains parameters captured here."""
        return any(self.owns(p) for g in optimizer.param_groups for p in g["params"])

    def before_step(self, optimizer: torch.optim.Optimizer, replica: int, args, kwargs):
        """Replacement `(args, kwargs)` for `optimizer.step` on `replica`, or None."""
        with self._shadow_lock:
            # Every replica's shadow copies the optimizer's state before any replica steps.
            for k in range(1, len(self.devices)):
                self._shadow(optimizer, k)
        if replica == 0:
            if self.central:
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        i = self._index.get(id(p))
                        if i is not None and self._components[i]:
                            grad = self._components[i][0].grad
                            p.grad = None if grad is None else grad.to(p.device)
            return None
        shadow = self._shadow(optimizer, replica)
        return (shadow, *args[1:]), kwargs

    def after_step(self, optimizer: torch.optim.Optimizer, replica: int) -> None:
        """Keep the replicas in step after `optimizer.step` (CentralStorage waits for it)."""
        if self.central:
            self.group.exchange(replica, "optimizer_step", None, combine=lambda _: None)
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        i = self._index.get(id(p))
                        if i is None or not self._components[i]:
                            continue
                        component = self._components[i][replica]
                        if component is not p and not self._aliases[i][replica]:
                            component.copy_(p)
        if replica == 0:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    i = self._index.get(id(p))
                    if i is not None:
                        self._versions[i] = tensor_version(p)

    def _shadow(self, optimizer: torch.optim.Optimizer, replica: int) -> torch.optim.Optimizer:
        shadows = self._shadows.setdefault(optimizer, {})
        shadow = shadows.get(replica)
        if shadow is not None and self._shadow_sources.get(shadow) is not optimizer.state:
            # optimizer.load_state_dict (a restored checkpoint) replaced the state: copy it
            # to every replica's shadow again, or they would step from their old state.
            shadow = None
        if shadow is None:
            shadow = optimizer.__class__.__new__(optimizer.__class__)
            shadow.__dict__.update(optimizer.__dict__)
            mapping = {} if self.central else self._maps[replica]
            shadow.param_groups = [
                {**g, "params": [mapping[id(p)] for p in g["params"] if id(p) in mapping]}
                for g in optimizer.param_groups
            ]
            if self.central:
                shadow.param_groups = []
            shadow.state = _copy_state(optimizer, mapping)
            self._shadow_sources[shadow] = optimizer.state
            shadows[replica] = shadow
        for mine, theirs in zip(shadow.param_groups, optimizer.param_groups):
            for name, value in theirs.items():
                if name != "params":
                    mine[name] = value
        return shadow


def _copy_state(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> Any:
    from collections import defaultdict

    state: defaultdict = defaultdict(dict)
    for p, values in optimizer.state.items():
        target = mapping.get(id(p))
        if target is not None:
            state[target] = {
                k: v.detach().to(target.device, copy=True) if isinstance(v, torch.Tensor) else v
                for k, v in values.items()
            }
    return state


def _install_optimizer_hooks() -> None:
    with _hooks_lock:
        if _hooks_installed[0]:
            return
        register_optimizer_step_pre_hook(_pre_step)
        register_optimizer_step_post_hook(_post_step)
        _hooks_installed[0] = True


def _replicas_for(optimizer: torch.optim.Optimizer) -> tuple[ReplicaParameters, int] | None:
    replica = context.current_replica_context()
    if replica is None:
        return None
    replicas = replica.strategy.extended.replicas
    if replicas is None or not replicas.owns_optimizer(optimizer):
        return None
    return replicas, replica.local_replica_index


@eager_between_graphs
def _pre_step(optimizer, args, kwargs):
    found = _replicas_for(optimizer)
    if found is None:
        return None
    replicas, index = found
    return replicas.before_step(optimizer, index, args, kwargs)


@eager_between_graphs
def _post_step(optimizer, args, kwargs) -> None:
    found = _replicas_for(optimizer)
    if found is not None:
        replicas, index = found
        replicas.after_step(optimizer, index)


def iterate_components(replicas: ReplicaParameters) -> Iterator[list[torch.Tensor]]:
    """Each captured tensor's components, replica 0 first (for tests and dashboards)."""
    yield from replicas.components
