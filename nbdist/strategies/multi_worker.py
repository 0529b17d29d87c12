"""`MultiWorkerMirroredStrategy`: one process per worker, joined in a torch.distributed group.

Each process holds one replica (its GPU, chosen by `LOCAL_RANK`, or one CPU replica), so the
replica id is the process's rank. The same training step that runs in one process runs here
unchanged: modules created in `scope()` are broadcast from rank 0 and their gradients averaged
in buckets during every backward, inside `strategy.run` or not (Note [Backward outside run]);
`reduce`, `gather` and the replica collectives run across the workers (Note [Checked
collectives]). The replica check (Note [Replica check]) turns parameters that differ across
workers, however caused, into `ReplicasDivergedError`.

Note [Backward outside run]: a DDP user ports `opt.zero_grad(); loss.backward(); opt.step()`
as it is, at the top of a `%%distribute` cell or a torchrun script, with no `strategy.run`.
Each worker holds exactly one replica, so such a step is the same computation as inside `run`,
and its backward averages the gradients of the parameters created in scope exactly as inside
`run` (DDP's contract: every backward through the wrapped model synchronises). Refusing it would
break the DDP port for nothing; skipping it would let the workers drift apart silently. Gradients
that must stay local: `strategy.scope(sync_gradients=False)` or `torch.autograd.grad`, which
never writes `.grad` and so never triggers the averaging. As with DDP, every worker must run
the same backward passes (a backward on some workers only waits for the others in the
gradient all-reduce until the collective timeout, which names the missing workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist.cluster_resolver import ClusterResolver, TFConfigClusterResolver, resolve_cluster
from nbdist.cluster_resolver.base import split_address
from nbdist.collectives.torch_dist import DistGroup
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.op import ReduceOp, as_reducible, refuse_bool
from nbdist.core.reduce.options import CommunicationImplementation, CommunicationOptions
from nbdist.core.values import select_replica
from nbdist.core.variables import (
    Variable,
    VariableAggregation,
    VariableSynchronization,
    create_distributed_variable,
)
from nbdist.errors import (
    ArgumentTypeError,
    ClusterConfigError,
    CollectiveMismatchError,
    InvalidArgumentError,
    NbdistWarning,
    ReplicasDivergedError,
)
from nbdist.strategies._compiled import translate_compile_error
from nbdist.strategies._grad_buckets import GradientBuckets
from nbdist.strategies._live_workers import (
    install_hooks,
    is_live,
    live_multi_worker_strategy,
    register,
    unregister,
)
from nbdist.strategies._replica_check import differing, diverged_message, fingerprint
from nbdist.strategies._worker_reduction import WorkerReduction
from nbdist.strategies.base import ReplicaContext, Strategy, module_registration_hooks
from nbdist.strategies.resizable import Resizable

__all__ = [
    "MultiWorkerMirroredStrategy",
    "WorkerTopology",
    "live_multi_worker_strategy",
    "worker_topology",
]

_WORKER_JOBS = ("chief", "worker")
REPLICA_CHECK_EVERY = 100
"""Optimizer steps between two replica checks (Note [Replica check]); 0 turns them off."""


@dataclasses.dataclass(frozen=True)
class WorkerTopology:
    """Where this process stands among the workers."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int | None = None


def worker_topology(resolver: ClusterResolver | None) -> WorkerTopology:
    """This worker's rank, the number of workers and the rendezvous address.

    Chief tasks come first, then workers (TensorFlow's order). The rendezvous is the first
    task's address.

    Raises:
        ValueError: a task type MultiWorkerMirroredStrategy cannot run as, or a `WORLD_SIZE`
            that disagrees with the cluster.
    """
    if resolver is None:
        return WorkerTopology(0, 1, "127.0.0.1", 0)
    spec = resolver.cluster_spec().as_dict()
    tasks: list[tuple[str, int, str]] = []
    for job in _WORKER_JOBS:
        addresses = spec.get(job, [])
        items = addresses.items() if isinstance(addresses, dict) else enumerate(addresses)
        tasks += [(job, int(index), address) for index, address in sorted(items)]
    if not tasks:
        return WorkerTopology(0, 1, "127.0.0.1", 0)
    task_type = resolver.task_type or "worker"
    task_id = resolver.task_id or 0
    if task_type not in _WORKER_JOBS:
        raise ClusterConfigError(
            f"This process is task {task_type!r} {task_id}, but MultiWorkerMirroredStrategy "
            f"runs only on {list(_WORKER_JOBS)} tasks. Use ParameterServerStrategy for 'ps' "
            "tasks, or start this process as a worker."
        )
    ranks = [(job, index) for job, index, _ in tasks]
    if (task_type, task_id) not in ranks:
        raise ClusterConfigError(
            f"Task {task_type!r} {task_id} is not in the cluster {spec}. Fix the task index."
        )
    rank = ranks.index((task_type, task_id))
    world_size = len(tasks)
    declared = os.environ.get("WORLD_SIZE")
    if declared is not None and declared.strip().isdigit() and int(declared) != world_size:
        raise ClusterConfigError(
            f"WORLD_SIZE is {declared} but the cluster from {type(resolver).__name__} has "
            f"{world_size} worker(s) {[f'{j}:{i}' for j, i in ranks]}. Make them agree (unset "
            "WORLD_SIZE, or fix TF_CONFIG / the launcher)."
        )
    host, port = split_address(tasks[0][2], variable="the first task's address")
    local_rank = getattr(resolver, "local_rank", None)
    return WorkerTopology(rank, world_size, host, port, local_rank)


class MultiWorkerMirroredStrategy(Resizable, Strategy):
    """Synchronous data parallelism over worker processes (gloo on CPUs, NCCL on GPUs).

    With no resolver it reads, in this order, `TF_CONFIG`, the torchrun variables and Slurm's;
    with none of them it is a single worker.

    Every backward through parameters created in `scope()` averages their gradients, inside
    `run` or not (Note [Backward outside run]); `check_replicas_identical()` compares the
    workers' copies, and runs by itself every `replica_check_every` optimizer steps (100; 0
    turns it off) and at the end of every `%%distribute` cell (Note [Replica check]).

    Args:
        cluster_resolver: Where the workers are; default: found from the environment.
        communication_options: `CommunicationOptions` (implementation, timeout, bucket size,
            compression).

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.MultiWorkerMirroredStrategy()  # no cluster variables: one worker
        >>> strategy.num_replicas_in_sync
        1
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
    ):
        super().__init__()
        if communication_options is None:
            communication_options = CommunicationOptions()
        if not isinstance(communication_options, CommunicationOptions):
            raise ArgumentTypeError(
                "communication_options must be nbdist.experimental.CommunicationOptions, got "
                f"{communication_options!r}."
            )
        self._options = communication_options
        resolver = cluster_resolver if cluster_resolver is not None else resolve_cluster()
        self._cluster_resolver = resolver if resolver is not None else TFConfigClusterResolver()
        topology = worker_topology(resolver)
        device = _local_device(topology)
        self._backend = _backend(communication_options.implementation, device)
        self._devices = (device,)
        self._target = physical_device(device)
        self._on_cuda = self._target.type == "cuda"
        self._parameter_devices = (device,)
        self._num_workers = topology.world_size
        self._worker_index = topology.rank
        self._topology = topology
        self._group: DistGroup | None = None
        if topology.world_size > 1:
            self._group = DistGroup(
                rank=topology.rank,
                world_size=topology.world_size,
                master_addr=topology.master_addr,
                master_port=topology.master_port,
                backend=self._backend,
                device=physical_device(device),
                timeout=communication_options.timeout,
                telemetry=self._telemetry,
            )
        self._captured: list[torch.Tensor] = []
        self._captured_ids: set[int] = set()
        self._names: dict[int, str] = {}  # captured tensor id -> "Module.attribute [shape]"
        self.replica_check_every = REPLICA_CHECK_EVERY
        self._steps = 0
        self._buckets = (
            GradientBuckets(
                self._group,
                bytes_per_pack=communication_options.bytes_per_pack,
                compression=communication_options.compression,
            )
            if self._group is not None
            else None
        )
        self._warned_outside = False
        self._cross_device_ops = WorkerReduction(
            self._across_workers, self._group, self._compression
        )
        self._cross_device_ops.telemetry = self._telemetry
        if self._group is not None:
            install_hooks(_check_outside_scope)
            register(self)

    @property
    def process_group(self) -> DistGroup | None:
        """The workers' process group (`nbdist.collectives.torch_dist.DistGroup`); None for
        one worker."""
        return self._group

    @property
    def process_group_backend(self) -> str:
        """The torch.distributed backend: "gloo" or "nccl"."""
        return self._backend

    def shutdown(self) -> None:
        """Leave the process group (call on every worker when done)."""
        if self._group is not None:
            self._group.shutdown()
        unregister(self)

    # -- scope ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _scope_hooks(self) -> Iterator[None]:
        fresh: list[torch.Tensor] = []
        sync = self._sync_gradients

        def capture(module: torch.nn.Module, name: str, tensor: Any) -> None:
            if (
                tensor is not None
                and context.current_scope_strategy() is self
                and context.current_replica_context() is None
                and id(tensor) not in self._captured_ids
            ):
                self._captured_ids.add(id(tensor))
                self._captured.append(tensor)
                shape = list(tensor.shape)
                self._names[id(tensor)] = f"{type(module).__name__}.{name} {shape}"
                fresh.append(tensor)

        hooks = module_registration_hooks(capture, buffers=True, submodules=False)
        target = physical_device(self._devices[0])
        device_scope = torch.device(target) if target.type != "cpu" else contextlib.nullcontext()
        try:
            with hooks, device_scope:
                yield
        finally:
            if fresh and self._group is not None:
                self._group.broadcast_(fresh, src=0)
                params = [t for t in fresh if isinstance(t, torch.nn.Parameter)]
                if sync and self._buckets is not None:
                    before = len(self._buckets.buckets)
                    self._buckets.add(params)
                    layout = self._buckets.layout()[before:]
                    self._group.check("gradient layout", layout)

    # -- run ------------------------------------------------------------------------------
    def _replica_in_this_thread(self) -> ReplicaContext:
        return ReplicaContext(self, self._worker_index, 0)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        # `run` has entered `_replica_in_this_thread()`, this worker's one replica context.
        # The gradient buckets average every backward, in `run` or not (Note [Backward
        # outside run]): nothing to switch on here.
        try:
            args = select_replica(0, args) if args else args
            if kwargs:
                kwargs = select_replica(0, kwargs)
            if self._on_cuda:
                with _cuda_scope(self._target):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        except BaseException as error:
            translated = translate_compile_error(error, self._worker_index)
            if translated is not error:
                # Refused while compiling, before any collective: every worker raises it alike
                # and the group stays healthy.
                raise translated from None
            if self._group is not None and not isinstance(
                error, (KeyboardInterrupt, CollectiveMismatchError, ReplicasDivergedError)
            ):
                self._group.publish_failure(f"{type(error).__name__}: {error}")
            _label(error, self._worker_index, self.num_replicas_in_sync)
            raise

    # -- collectives ----------------------------------------------------------------------
    def _timeout(self, options: Any) -> float | None:
        if isinstance(options, CommunicationOptions) and options.timeout_seconds is not None:
            return options.timeout
        return None

    def _compression(self, options: Any) -> str | None:
        return self._communication_options(options).compression

    def _replica_all_reduce(self, ctx: ReplicaContext, op: ReduceOp, value: Any, options) -> Any:
        if self._group is None:  # else the group refuses bools after the ranks agree
            from nbdist._private_api import pytree

            refuse_bool(op, [as_reducible(x, "all_reduce") for x in pytree.tree_leaves(value)])
            return value
        timeout, compression = None, self._options.compression
        if options is not None:
            timeout, compression = self._timeout(options), self._compression(options)
        if type(value) is torch.Tensor:  # the common case: one tensor, no tree to walk
            return self._group.all_reduce_tensor(
                value, op, timeout=timeout, compression=compression
            )
        from nbdist._private_api import pytree

        leaves, spec = pytree.tree_flatten(value)
        tensors = [as_reducible(t, "all_reduce") for t in leaves]
        if not tensors:
            return value
        reduced = self._group.all_reduce(tensors, op, timeout=timeout, compression=compression)
        return pytree.tree_unflatten(reduced, spec)

    def _replica_all_gather(self, ctx: ReplicaContext, value: Any, axis: int, options) -> Any:
        from nbdist._private_api import pytree

        leaves, spec = pytree.tree_flatten(value)
        out = []
        for leaf in leaves:
            tensor = as_reducible(leaf, "all_gather")
            if tensor.dim() == 0 or not -tensor.dim() <= axis < tensor.dim():
                raise InvalidArgumentError(
                    f"all_gather along axis {axis} needs values of rank > {axis}, got shape "
                    f"{tuple(tensor.shape)}. Reshape scalars with tensor.reshape(1)."
                )
            if self._group is None:
                out.append(tensor)
            else:
                out.append(
                    self._group.all_gather(
                        tensor, axis % tensor.dim(), timeout=self._timeout(options)
                    )
                )
        return pytree.tree_unflatten(out, spec)

    def _replica_merge_call(
        self, ctx: ReplicaContext, merge_fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> Any:
        with context.enter_replica_context(None):
            return merge_fn(self, *args, **kwargs)

    def _across_workers(self, op: ReduceOp, tensor: torch.Tensor) -> torch.Tensor:
        """Combine one local tensor across workers (used by reduce and variables)."""
        if self._group is None:
            return tensor
        return self._group.all_reduce([tensor], op)[0]

    def _broadcast_from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._group is None:
            return tensor
        copy = tensor.detach().clone()
        self._group.broadcast_([copy], src=0)
        return copy

    def _gather_across_workers(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        if self._group is None:
            return tensor
        return self._group.all_gather(tensor, axis)

    # -- variables ------------------------------------------------------------------------
    def _create_variable(
        self,
        initial_value: Any,
        trainable: bool | None = None,
        synchronization: Any = VariableSynchronization.AUTO,
        aggregation: Any = VariableAggregation.NONE,
        name: str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Variable:
        broadcast = self._group.broadcast_ if self._group is not None else None
        return create_distributed_variable(
            self, lambda on_read: self._devices, initial_value, trainable, synchronization,
            aggregation, name, dtype, broadcast=broadcast,
        )  # fmt: skip

    # -- checks ---------------------------------------------------------------------------
    def _mirrored_parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients are averaged, in bucket order (the same on every
        worker: the layout is checked when the scope exits)."""
        if self._buckets is None:
            return []
        return [p for bucket in self._buckets.buckets for p in bucket.params]

    def replica_fingerprint(self) -> tuple[list[str], list[int], torch.Tensor]:
        """Names, sizes and `fingerprint` of this worker's mirrored parameters (no collective)."""
        params = self._mirrored_parameters()
        names = [self._names.get(id(p), f"parameter {i}") for i, p in enumerate(params)]
        return names, [p.numel() for p in params], fingerprint(params)

    def check_replicas_identical(self, when: str = "on request") -> None:
        """Compare the workers' mirrored parameters (Note [Replica check]); a collective that
        every worker must call.

        One fingerprint per gradient bucket travels in one small all-reduce; only when some
        bucket differs are its parameters compared one by one (a second all-reduce, on every
        worker alike: they all see the same reduced values), to name them.

        Raises:
            ReplicasDivergedError: on every worker, when any parameter differs.

        Example:
            >>> import nbdist as nd
            >>> nd.MultiWorkerMirroredStrategy().check_replicas_identical()  # one worker: no-op
        """
        if self._group is None or self._buckets is None or not self._buckets.buckets:
            return
        buckets = self._buckets.buckets
        high, low = self._spread(self._buckets.fingerprint())
        sizes = [int(b.buffer.numel()) for b in buckets]
        bad_buckets = differing(high, low, sizes)
        if not bad_buckets:
            self._telemetry.note_replica_check(True)
            return
        params = [p for i in bad_buckets for p in buckets[i].params]
        high, low = self._spread(fingerprint(params))
        names = [self._names.get(id(p), f"parameter {i}") for i, p in enumerate(params)]
        bad = differing(high, low, [p.numel() for p in params])
        spread = max(float(high[i, 1] - low[i, 1]) for i in bad) if bad else 0.0
        total = len(self._mirrored_parameters())
        message = diverged_message(
            names, bad, when, f" (largest difference in a parameter's norm: {spread:.3g})",
            total=total,
        )  # fmt: skip
        self._telemetry.note_replica_check(False, message)
        raise ReplicasDivergedError(message)

    def realign_replicas(self) -> None:
        """Copy replica 0's values of every parameter created in this strategy's scope to every
        replica: the fix for a `ReplicasDivergedError`, also for the parameters of a model no
        longer in use (the strategy keeps every parameter made in its scope, so a model
        created again does not retire the old one's divergence). A collective that every
        worker must call (in a `%%distribute` cell, or on every torchrun process).

        Example:
            >>> import nbdist as nd
            >>> nd.MultiWorkerMirroredStrategy().realign_replicas()  # one worker: nothing to do
        """
        params = self._mirrored_parameters()
        if self._group is None or not params:
            return
        with torch.no_grad():
            for param in params:
                self._group.broadcast_([param.data], src=0)
        self._telemetry.note_replica_check(True)

    def _spread(self, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The largest and smallest values of `local` over the workers (one all-reduce)."""
        assert self._group is not None
        both = self._group.all_reduce([torch.cat([local, -local])], ReduceOp.MAX)[0]
        return both[: len(local)], -both[len(local) :]

    @property
    def last_replica_check(self) -> tuple[float, bool, str] | None:
        """(wall time, replicas identical, message) of the newest replica check, if any."""
        return self._telemetry.replica_check

    def count_optimizer_step(self) -> None:
        """Count an optimizer step over this strategy's parameters (nbdist's optimizer hook
        calls it after each) and run the replica check every `replica_check_every` steps."""
        if not is_live(self):  # shut down: no group to check over
            return
        self._steps += 1
        every = self.replica_check_every
        if every and self._steps % every == 0:
            self.check_replicas_identical(f"after optimizer step {self._steps}")

    def owns_parameters(self, params: list[torch.Tensor]) -> bool:
        """True when one of `params` was created in this strategy's scope (its gradients are
        averaged across the workers in every backward)."""
        buckets = self._buckets
        return buckets is not None and buckets.holds_any(params)

    def warn_if_not_captured(self, params: list[torch.Tensor]) -> None:
        """Warn once when parameters made outside `scope()` are trained inside `run`."""
        if self._warned_outside or self._group is None:
            return
        outside = [p for p in params if id(p) not in self._captured_ids]
        if outside:
            self._warned_outside = True
            warnings.warn(
                f"{len(outside)} parameter(s) trained inside strategy.run were created outside "
                "strategy.scope(), so their gradients are not averaged across workers and the "
                "workers' copies will drift apart. Create the model (and optimizer) inside "
                "`with strategy.scope():`.",
                NbdistWarning,
                stacklevel=4,
            )




def _check_outside_scope(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    replica = context.current_replica_context()
    strategy = replica.strategy if replica is not None else None
    if isinstance(strategy, MultiWorkerMirroredStrategy):
        strategy.warn_if_not_captured(
            [p for group in optimizer.param_groups for p in group["params"]]
        )


def _label(error: BaseException, replica: int, count: int) -> None:
    from nbdist.strategies.local import _label as label

    if count > 1:
        label(error, replica, count)


@contextlib.contextmanager
def _cuda_scope(target: torch.device) -> Iterator[None]:
    with torch.cuda.device(target), torch.device(target):
        yield


def _local_device(topology: WorkerTopology) -> str:
    count = torch.cuda.device_count()
    if not count:
        return "cpu:0"
    local = topology.local_rank if topology.local_rank is not None else topology.rank
    return f"cuda:{local % count}"


def _backend(implementation: CommunicationImplementation, device: str) -> str:
    on_gpu = device.startswith("cuda")
    if implementation is CommunicationImplementation.NCCL:
        if not on_gpu:
            raise InvalidArgumentError(
                "CommunicationImplementation.NCCL needs a CUDA GPU on every worker, but this "
                "machine has none. Use CommunicationImplementation.RING (gloo) or AUTO."
            )
        return "nccl"
    if implementation is CommunicationImplementation.RING:
        return "gloo"
    return "nccl" if on_gpu else "gloo"
