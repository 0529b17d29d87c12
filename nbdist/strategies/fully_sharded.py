"""`FullyShardedStrategy`: data parallelism with every parameter sharded over the workers (FSDP2).

The workers, their process group, `run`, `reduce`, `gather`, the input pipeline and the replica
collectives are `MultiWorkerMirroredStrategy`'s; what differs is what `scope()` does to the
modules created inside it. Where the mirrored strategy broadcasts their parameters and averages
their gradients in buckets, this one broadcasts them (so every worker starts from the same
values) and then shards every model with PyTorch's `fully_shard`, unit by unit as the `shard`
policy chooses (`nbdist.strategies._shard_policy`): each worker keeps 1/N of the rows of each
parameter (a `DTensor` on a 1-D device mesh over the workers), of its gradient and of the
optimizer state; a unit's parameters are all-gathered for its forward and backward and its
gradients reduce-scattered (averaged) after, through the group's bookkeeping
(`nbdist.collectives.sharded`), so they are recorded as every other collective is.

Note [Sharding at scope exit]: a model is sharded when the outermost `scope()` exits, not as
each module is created (a module's tree, its tied parameters and its sizes are known only once
its constructor has returned: the policy needs them) and not at the first `run` (a step outside
`run`, a `state_dict()` or a checkpoint restore before it would see whole tensors, and the
memory would stay replicated until then). An optimizer created in the same scope was given the
whole parameters; at its first `step` it is pointed at their shards (before any state exists,
so nothing is lost), so it steps on 1/N of each parameter (docs/sharding.md).

Example:
    >>> import nbdist as nd
    >>> strategy = nd.experimental.FullyShardedStrategy()  # no cluster variables: one worker
    >>> strategy.num_replicas_in_sync
    1
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist.cluster_resolver import ClusterResolver
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.errors import ArgumentTypeError, InvalidArgumentError, NbdistWarning, NotShardedError
from nbdist.strategies._shard_policy import ShardPolicy, check_policy, choose_units
from nbdist.strategies.base import module_registration_hooks
from nbdist.strategies.multi_worker import MultiWorkerMirroredStrategy

__all__ = ["DEFAULT_MIN_SHARD_BYTES", "FullyShardedStrategy", "is_sharded"]

DEFAULT_MIN_SHARD_BYTES = 1 << 20
"""`min_shard_bytes` by default: a subtree becomes a unit from 1 MiB of parameters on."""

BROADCAST_CHUNK_BYTES = 16 << 20
"""The scope's broadcast of new parameters goes in pieces of about this size, so it never
holds a flat copy of the whole model (the memory sharding is there to save)."""


def is_sharded(tensor: Any) -> bool:
    """True for a parameter sharded by `FullyShardedStrategy` (a `DTensor`).

    Example:
        >>> is_sharded(torch.zeros(2))
        False
    """
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(tensor, dtensor)


class FullyShardedStrategy(MultiWorkerMirroredStrategy):
    """Data parallelism whose models are sharded over the workers with FSDP2 (`fully_shard`).

    Every worker holds 1/N of each sharded parameter, of its gradient and of its optimizer
    state (N workers); a unit's parameters are gathered whole for its forward and backward
    only. Same `scope()`, `run`, `reduce`, `gather`, `experimental_distribute_dataset` and
    `num_replicas_in_sync` as `MultiWorkerMirroredStrategy`; with no resolver the cluster is
    found from `TF_CONFIG`, the torchrun variables or Slurm's. One worker has nothing to shard
    across: its models stay whole.

    Args:
        cluster_resolver: Where the workers are; default: found from the environment.
        shard: The units: `"auto"` (the smallest subtrees holding `min_shard_bytes` of
            parameters, e.g. one per block) or a callable `module -> bool`. The root of
            every model created in scope is a unit too, so every parameter is sharded.
        min_shard_bytes: The size from which "auto" makes a subtree a unit (default 1 MiB).
        mixed_precision: None, a `torch.distributed.fsdp.MixedPrecisionPolicy`, or a dtype
            (`torch.bfloat16`, "bfloat16"): compute in that dtype, reduce gradients in float32.
        offload: True (or a `torch.distributed.fsdp.CPUOffloadPolicy`): keep the shards, their
            gradients and the optimizer step on the CPU between uses (workers on GPUs only:
            on CPU workers it raises `InvalidArgumentError`).
        communication_options: `CommunicationOptions` (implementation, timeout).

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.experimental.FullyShardedStrategy(shard="auto", min_shard_bytes=0)
        >>> with strategy.scope():
        ...     model = torch.nn.Linear(4, 2)
        >>> strategy.gather(model.weight).shape  # the whole parameter, on every worker
        torch.Size([2, 4])
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        *,
        shard: ShardPolicy = "auto",
        min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
        mixed_precision: Any = None,
        offload: Any = False,
        communication_options: CommunicationOptions | None = None,
    ):
        check_policy(shard, min_shard_bytes)
        self._mixed_precision = _mixed_precision_policy(mixed_precision)
        self._offload = _offload_policy(offload)
        super().__init__(cluster_resolver, communication_options)
        if self._offload is not None and self._target.type == "cpu":
            self.shutdown()  # on every worker alike: each one finds it computes on the CPU
            raise InvalidArgumentError(
                "offload=True keeps the shards in CPU memory between uses, for workers that "
                "compute on GPUs; these workers compute on the CPU, where the shards already "
                "are. Leave offload out (or run the workers on GPUs)."
            )
        self._shard = shard
        self._min_shard_bytes = min_shard_bytes
        self._mesh: Any = None
        self._units: list[weakref.ref] = []
        self._sharded_ids: set[int] = set()
        _install_repoint_hook()

    @property
    def shard_policy(self) -> ShardPolicy:
        """The `shard` policy: "auto" or the callable given."""
        return self._shard

    @property
    def units(self) -> list[torch.nn.Module]:
        """The modules sharded so far (FSDP units), children before parents, alive ones only."""
        return [m for m in (ref() for ref in self._units) if m is not None]

    # -- scope ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _scope_hooks(self) -> Iterator[None]:
        if self._group is None:  # one worker: nothing to shard across
            with super()._scope_hooks():
                yield
            return
        fresh: list[torch.Tensor] = []
        seen: set[int] = set()
        modules: list[weakref.ref] = []
        tracked: set[int] = set()
        children: set[int] = set()

        def track(module: torch.nn.Module) -> None:
            if id(module) not in tracked:
                tracked.add(id(module))
                modules.append(weakref.ref(module))

        def capture(module: torch.nn.Module, name: str, value: Any) -> None:
            if (
                value is None
                or context.current_scope_strategy() is not self
                or context.current_replica_context() is not None
            ):
                return
            track(module)
            if isinstance(value, torch.nn.Module):
                children.add(id(value))
                track(value)
            elif id(value) not in seen:
                seen.add(id(value))
                fresh.append(value)
                if isinstance(value, torch.nn.Parameter):
                    self._captured_ids.add(id(value))
                    self._names[id(value)] = f"{type(module).__name__}.{name} {list(value.shape)}"

        hooks = module_registration_hooks(capture, buffers=True, submodules=True)
        target = physical_device(self._devices[0])
        device_scope = torch.device(target) if target.type != "cpu" else contextlib.nullcontext()
        with hooks, device_scope:
            yield
        # Reached on a normal exit only: a scope that raised leaves its modules whole.
        for chunk in _chunks(fresh, BROADCAST_CHUNK_BYTES):  # not one flat copy of the model
            self._group.broadcast_(chunk, src=0)
        roots = [
            m for m in (ref() for ref in modules)
            if m is not None and id(m) not in children and _has_parameters(m)
        ]  # fmt: skip
        for root in roots:
            if not _already_sharded(root):
                self._shard_model(root)

    def _shard_model(self, root: torch.nn.Module) -> None:
        """Apply `fully_shard` to the units of `root` (children first) and point the old
        parameters at their shards (Note [Sharding at scope exit])."""
        from torch.distributed.fsdp import fully_shard

        from nbdist.collectives.sharded import FsdpAllGather, FsdpReduceScatter

        units = choose_units(root, self._shard, min_shard_bytes=self._min_shard_bytes)
        if len(units) == 1 and self._shard != "auto" and _has_nested_parameters(root):
            warnings.warn(
                f"The shard policy chose no module inside {type(root).__name__}: the whole "
                "model is one unit, gathered whole for every forward and backward, so its "
                "peak memory is the mirrored strategy's. Choose its blocks (shard=lambda m: "
                "isinstance(m, Block)) or lower min_shard_bytes.",
                NbdistWarning,
                stacklevel=4,
            )
        before = list(root.named_parameters(remove_duplicate=False))
        # Resharded after every forward, the root too (FSDP2 keeps the root's parameters
        # gathered after forward by default): else an evaluation forward, with no backward
        # after it, would leave the root's parameters whole until the next backward.
        options: dict[str, Any] = {"mesh": self._device_mesh(), "reshard_after_forward": True}
        if self._mixed_precision is not None:
            options["mp_policy"] = self._mixed_precision
        if self._offload is not None:
            options["offload_policy"] = self._offload
        for unit in units:
            fully_shard(unit, **options)
            unit.set_custom_all_gather(FsdpAllGather(self._group))
            unit.set_custom_reduce_scatter(FsdpReduceScatter(self._group))
            self._units.append(weakref.ref(unit))
        after = dict(root.named_parameters(remove_duplicate=False))
        for name, old in before:
            new = after.get(name)
            if new is not None and new is not old:
                _remember_shard(old, new)
                # The whole tensor is no longer the model's: free its memory now rather than
                # when the optimizer given it is pointed at the shard (its first step).
                old.data = torch.empty(0, dtype=old.dtype, device=old.device)
                self._sharded_ids.add(id(new))
                self._captured_ids.add(id(new))
                self._names[id(new)] = self._names.get(id(old), name)

    def _device_mesh(self) -> Any:
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self._target.type, (self._num_workers,))
        return self._mesh

    # -- run ------------------------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._group is not None:
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.nn.Module):
                    self._refuse_unsharded(value, "passed to strategy.run")
        return super()._call_for_each_replica(fn, args, kwargs)

    def _refuse_unsharded(self, module: torch.nn.Module, how: str) -> None:
        whole = [n for n, p in module.named_parameters() if not is_sharded(p)]
        if whole:
            raise NotShardedError(
                f"{type(module).__name__} {how} has {len(whole)} parameter(s) that are not "
                f"sharded ({whole[0]!r} first): it was created outside "
                "FullyShardedStrategy.scope(), so its gradients would not be reduced across "
                "the workers and their copies would drift apart. Create the model (and its "
                "optimizer) inside `with strategy.scope():`."
            )

    def warn_if_not_captured(self, params: list[torch.Tensor]) -> None:
        """Refuse an optimizer step in `run` over parameters neither sharded nor created in
        scope (`NotShardedError`, on every worker: they would drift apart)."""
        if self._group is None:
            return super().warn_if_not_captured(params)
        outside = [
            p for p in params
            if not is_sharded(_shard_of(p)) and id(p) not in self._captured_ids
        ]  # fmt: skip
        if outside:
            raise NotShardedError(
                f"{len(outside)} parameter(s) stepped inside strategy.run (shape "
                f"{list(outside[0].shape)} first) were created outside "
                "FullyShardedStrategy.scope(), so they are not sharded and their gradients "
                "are not reduced across the workers. Create the model (and its optimizer) "
                "inside `with strategy.scope():`."
            )

    # -- cross-replica --------------------------------------------------------------------
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """As `MultiWorkerMirroredStrategy.reduce`; a sharded parameter (a `DTensor`) counts
        as its whole value on every replica, like a mirrored variable in TensorFlow: "mean",
        "max" and "min" give it back whole, "sum" N times it (docs/tf-differences.md).

        Example:
            >>> import nbdist as nd
            >>> s = nd.experimental.FullyShardedStrategy()
            >>> s.reduce("sum", torch.ones(2), axis=None)
            tensor([1., 1.])
        """
        return super().reduce(reduce_op, _whole(value), axis)

    def gather(self, value: Any, axis: int | None = None) -> Any:
        """The whole tensor of a sharded parameter (its shards gathered: `full_tensor()`),
        whatever `axis` (a parameter left whole comes back as it is); other values as
        `MultiWorkerMirroredStrategy.gather` (`axis` needed).

        A collective: every worker calls it, with the same values.

        Raises:
            InvalidArgumentError: `axis` left out for a value that is not sharded.

        Example:
            >>> import nbdist as nd
            >>> s = nd.experimental.FullyShardedStrategy()
            >>> s.gather(torch.ones(1, 2), axis=0).shape
            torch.Size([1, 2])
        """
        from nbdist._private_api import pytree
        from nbdist.core.values import DistributedValues

        def one(leaf: Any) -> Any:
            if is_sharded(leaf):
                return leaf.full_tensor().detach()
            if axis is None and isinstance(leaf, torch.nn.Parameter):
                return leaf.detach()  # not sharded (one worker): already whole
            if axis is None:
                raise InvalidArgumentError(
                    f"gather needs an axis for a value that is not sharded (got a "
                    f"{type(leaf).__name__}); pass axis=0 to concatenate the replicas' values."
                )
            return MultiWorkerMirroredStrategy.gather(self, leaf, axis)

        return pytree.tree_map(
            one, value, is_leaf=lambda leaf: isinstance(leaf, DistributedValues)
        )

    # -- memory ---------------------------------------------------------------------------
    def local_bytes(self, module: torch.nn.Module, optimizer: Any = None) -> dict[str, int]:
        """Bytes this worker holds for `module`: its parameters (local shards), their
        gradients, and `optimizer`'s state for them (no collective).

        Example:
            >>> import nbdist as nd
            >>> nd.experimental.FullyShardedStrategy().local_bytes(torch.nn.Linear(2, 2))
            {'parameters': 24, 'gradients': 0, 'optimizer': 0}
        """
        params = list(module.parameters())
        out = {"parameters": sum(_nbytes(p) for p in params), "gradients": 0, "optimizer": 0}
        out["gradients"] = sum(_nbytes(p.grad) for p in params if p.grad is not None)
        if optimizer is not None:
            ids = {id(p) for p in params}
            for p, state in optimizer.state.items():
                if id(p) in ids:
                    out["optimizer"] += sum(
                        _nbytes(v) for v in state.values()
                        if isinstance(v, torch.Tensor) and v.dim() > 0
                    )  # fmt: skip
        return out


# -- the shards of the parameters an optimizer was given -----------------------------------
_shards: dict[int, tuple[weakref.ref, weakref.ref]] = {}  # id(old) -> (old, its shard)
# optimizer -> (its number of parameters, len(_shards)) when last pointed at the shards
_repointed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_hook_lock = threading.Lock()
_hook: list[Any] = []


def _remember_shard(old: torch.Tensor, new: torch.Tensor) -> None:
    key = id(old)
    _shards[key] = (weakref.ref(old, lambda _: _shards.pop(key, None)), weakref.ref(new))


def _shard_of(param: torch.Tensor) -> torch.Tensor:
    """The shard that replaced `param` when its model was sharded, or `param` itself."""
    found = _shards.get(id(param))
    if found is None or found[0]() is not param:
        return param
    shard = found[1]()
    return shard if shard is not None else param


def repoint_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Point `optimizer` at the shards of the parameters it was given before their model was
    sharded (Note [Sharding at scope exit]); cheap when there is nothing to do.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> repoint_optimizer(opt)  # not sharded: unchanged
    """
    if not _shards:
        return
    key = (sum(len(g["params"]) for g in optimizer.param_groups), len(_shards))
    if _repointed.get(optimizer) == key:
        return
    for group in optimizer.param_groups:
        params = group["params"]
        for i, p in enumerate(params):
            shard = _shard_of(p)
            if shard is not p:
                params[i] = shard
                optimizer.state.pop(p, None)  # none yet: it was never stepped whole
    _repointed[optimizer] = key


def _repoint(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if not torch.compiler.is_compiling():
        repoint_optimizer(optimizer)


def _install_repoint_hook() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    with _hook_lock:
        if not _hook:
            _hook.append(register_optimizer_step_pre_hook(_repoint))


# -- helpers -----------------------------------------------------------------------------
def _chunks(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """`tensors` in order, in lists of at most `limit` bytes (a larger tensor alone)."""
    out: list[list[torch.Tensor]] = []
    size = limit
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(tensor)
        size += nbytes
    return out


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def _whole(value: Any) -> Any:
    from nbdist._private_api import pytree

    return pytree.tree_map(
        lambda leaf: leaf.full_tensor().detach() if is_sharded(leaf) else leaf, value
    )


def _nbytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if is_sharded(tensor) else tensor
    return local.numel() * local.element_size()


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(iter(module.parameters()), None) is not None


def _has_nested_parameters(root: torch.nn.Module) -> bool:
    return any(_has_parameters(child) for child in root.children())


def _already_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _mixed_precision_policy(value: Any) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentTypeError(
            "mixed_precision must be None, a torch.distributed.fsdp.MixedPrecisionPolicy or "
            f"a floating dtype (torch.bfloat16, 'float16'), got {value!r}."
        )
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def _offload_policy(value: Any) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy

    if value is False or value is None:
        return None
    if value is True:
        return CPUOffloadPolicy()
    if isinstance(value, CPUOffloadPolicy):
        return value
    raise ArgumentTypeError(
        f"offload must be True, False or a torch.distributed.fsdp.CPUOffloadPolicy, got "
        f"{value!r}."
    )
