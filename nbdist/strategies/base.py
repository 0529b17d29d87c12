"""`Strategy`, `StrategyExtended` and `ReplicaContext`: the API every strategy shares.

Public methods validate their arguments, then call one `_hook` that each strategy implements
(TensorFlow's layering). Imports core modules only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter
from typing import Any

import torch

from nbdist._private_api import pytree
from nbdist.core import context
from nbdist.core.reduce.cross_device import CrossDeviceOps
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.core.values import DistributedValues, regroup, select_replica
from nbdist.errors import ArgumentTypeError, ContextError
from nbdist.strategies.extended import StrategyExtended
from nbdist.strategies.replica_context import ReplicaContext
from nbdist.telemetry.records import Telemetry

__all__ = [
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "check_run_options",
    "module_registration_hooks",
]


class Strategy:
    """A set of devices and a policy for computing and keeping variables on them.

    Implement these (subclasses): `_call_for_each_replica`, `_replica_all_reduce`,
    `_replica_all_gather`, `_replica_merge_call`, `_create_variable`, and set `_devices`,
    `_parameter_devices`, `_cross_device_ops`, `_options` in `__init__`. Only the strategy,
    its `StrategyExtended` and its `ReplicaContext` touch these; other code goes through
    `strategy.extended` (ruff's SLF001 checks it).
    Inherited: `scope`, `run`, `reduce`, `gather`, `experimental_local_results`,
    `experimental_distribute_values_from_function`, the dataset functions and `extended`.

    Example:
        >>> import nbdist as nd
        >>> strategy = nd.OneDeviceStrategy("cpu:0")
        >>> strategy.reduce("sum", strategy.run(lambda: torch.tensor(2.0)), axis=None)
        tensor(2.)
    """

    _devices: tuple[str, ...] = ("cpu:0",)
    _parameter_devices: tuple[str, ...] = ("cpu:0",)
    _num_workers: int = 1
    _worker_index: int = 0
    _cluster_resolver: Any = None
    _replicas: Any = None  # in-process strategies: their replicas' parameters (`_replicas`)

    def __init__(self) -> None:
        self._options = CommunicationOptions()
        self._cross_device_ops: CrossDeviceOps | None = None
        self._telemetry = Telemetry()
        self._extended = StrategyExtended(self)
        self._scope_depth = 0
        self._sync_gradients = True

    # -- properties -----------------------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas of all workers that take part in every step."""
        return len(self._devices) * self._num_workers

    @property
    def extended(self) -> StrategyExtended:
        """Additional APIs for algorithms that need to be distribution-aware."""
        return self._extended

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver of a multi-worker strategy; None for single-worker ones."""
        return self._cluster_resolver

    @property
    def _is_multi_replica(self) -> bool:
        return len(self._devices) > 1

    # -- scope ----------------------------------------------------------------------------
    # Whether `scope()` enters cross-replica context; only the default strategy's does not.
    changes_context = True

    def _replica_in_this_thread(self) -> ReplicaContext | None:
        """The replica context `run` enters in the caller's thread, for a strategy that runs
        its one local replica there (None: `_call_for_each_replica` enters each replica's).
        A new one per call: one kept on the strategy would make strategy and context a cycle
        that only the garbage collector frees, at interpreter exit among the group's threads."""
        return None

    @contextlib.contextmanager
    def scope(self, *, sync_gradients: bool = True) -> Iterator[Strategy]:
        """Make this strategy current and capture the variables and modules created inside.

        Context: cross-replica (enters it). Re-entering the same strategy nests.

        Args:
            sync_gradients: Average the gradients of modules created in this scope after every
                `backward()` (set False to reduce gradients yourself).

        Raises:
            RuntimeError: another strategy's scope is active.
        """
        with context.enter_strategy(self):
            outer = self._sync_gradients
            self._sync_gradients = sync_gradients
            self._scope_depth += 1
            try:
                outermost = self._scope_depth == 1
                with self._scope_hooks() if outermost else contextlib.nullcontext():
                    yield self
            finally:
                self._scope_depth -= 1
                self._sync_gradients = outer

    @contextlib.contextmanager
    def _scope_hooks(self) -> Iterator[None]:
        """Entered by the outermost `scope()` only: capture what is created inside (modules'
        parameters, typically through `module_registration_hooks`)."""
        yield

    # -- run ------------------------------------------------------------------------------
    # Note [Calls per collective]: a user's small collective, `strategy.run(step)` whose step
    # calls `get_replica_context().all_reduce(...)`, is timed call by call against raw
    # `dist.all_reduce(t.clone())` (benchmarks/bench_user_collective.py). What it costs over
    # raw is Python right after a barrier, when caches are cold (the other rank's threads share
    # the 2 cores): the same work written inline in three functions (contexts, trailer copy,
    # collective, trailer read, telemetry) ran at raw's latency, while the layered path did not
    # (benchmarks/results/recorded/calls-per-collective.json). Not the number of functions as
    # such (trivial extra ones cost nothing measurable) but the distinct code and data each
    # layer touches: checks that build objects, cache lookups, wrappers, tree walks. So the
    # path does little:
    # `run` enters the one replica context of a strategy that runs its replica in the caller's
    # thread (`_replica_in_this_thread`) together with the strategy, the context variables'
    # own `get` answers `current_replica_context()`, ops are read from `RESOLVED_OPS`, the
    # replica ids are computed once, the clock is read without a wrapper, and the group keeps
    # each agreed layout prepared (Note [Prepared layouts]). Keep new work off this path.
    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """Call `fn` once per local replica, in that replica's context and on its device.

        Distributed values in `args`/`kwargs` are unwrapped to each replica's component.

        Context: cross-replica or the default context (not inside another `run`).
        `options` must be None: TensorFlow's `RunOptions` only configure TPU and XLA
        compilation, which nbdist does not have, so any other value raises
        `UnsupportedOptionError` rather than being ignored.
        Hangs if: never; a replica that fails releases the others, and its exception is
        re-raised with its replica id in the message.

        Returns:
            Leaf by leaf, the object itself when every replica returned the identical object,
            else a `PerReplica`.
        """
        if not callable(fn):
            raise ArgumentTypeError(f"strategy.run needs a function to call, got {fn!r}.")
        active = context.current_scope_strategy()
        if active is not None and active is not self:
            raise context.StrategyMixingError(
                f"Mixing different nbdist.Strategy objects: {type(self).__name__}.run was called "
                f"inside the scope of {type(active).__name__}. Call run on the strategy whose "
                "scope is active, or leave that scope first."
            )
        if context.current_replica_context() is not None and self._is_multi_replica:
            raise ContextError(
                "strategy.run was called inside strategy.run. Call collectives "
                "(nbdist.get_replica_context().all_reduce/merge_call) inside the replica "
                "function instead of nesting run."
            )
        if context.in_merge_call() and self._is_multi_replica:
            raise ContextError(
                "strategy.run was called inside a merge_call function (merge_fn). merge_fn runs "
                "once, in cross-replica context, while every replica waits in merge_call, so "
                "the replicas cannot run again until it returns. Do the per-replica work in "
                "the replica function (before or after merge_call), and in merge_fn combine "
                "its PerReplica arguments with strategy.reduce or strategy.extended.reduce_to."
            )
        if options is not None:
            check_run_options(options)
        kwargs = dict(kwargs) if kwargs else {}
        telemetry = self._telemetry
        # telemetry's clock (`nbdist.telemetry.records.now`), without a frame
        start = perf_counter()
        # Mixing was checked above. A strategy whose one local replica runs in this thread
        # enters that replica's context here too (Note [Calls per collective]).
        tokens = context.set_strategy_context(self, self._replica_in_this_thread())
        try:
            return self._call_for_each_replica(fn, tuple(args), kwargs)
        finally:
            context.reset(tokens)
            if telemetry.enabled:
                telemetry.record_step(self._local_replica_ids, start, perf_counter() - start)

    # -- cross-replica combination ----------------------------------------------------------
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Combine a per-replica value (any nested structure) into one value.

        Context: cross-replica. Hangs if: never in one process.

        Args:
            reduce_op: `ReduceOp` or its name ("sum", "mean", "max", "min").
            value: What `run` returned; a plain value counts as the same on every replica.
            axis: Also reduce along this dimension of each component (e.g. the batch axis);
                with `MEAN` the denominator is the total length along it over all replicas.

        Returns:
            A tensor (or structure of tensors) on the caller's device.

        Example:
            >>> import nbdist as nd
            >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
            >>> v = s.experimental_distribute_values_from_function(
            ...     lambda ctx: torch.tensor([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1))
            >>> s.reduce("sum", v, axis=None), s.reduce("mean", v, axis=0)
            (tensor([3., 6.]), tensor(2.2500))
        """
        op = ReduceOp.from_value(reduce_op)
        from nbdist.core.reduce import rules as reduction

        reduction.check_axis_argument(axis, "reduce", optional=True)

        return pytree.tree_map(
            lambda leaf: reduction.reduce_value(self.extended, op, leaf, axis),
            value,
            is_leaf=lambda leaf: isinstance(leaf, DistributedValues),
        )

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenate the replicas' components along `axis`, in replica order.

        Context: cross-replica (inside `run` use `ReplicaContext.all_gather`). A value that is
        not distributed (a plain tensor) comes back unchanged, as in TensorFlow; across
        workers it is this worker's component.

        Raises:
            ValueError: components of rank 0, or `axis` out of range.

        Example:
            >>> import nbdist as nd
            >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
            >>> v = s.experimental_distribute_values_from_function(lambda ctx: torch.ones(1, 2))
            >>> s.gather(v, axis=0).shape
            torch.Size([2, 2])
        """
        from nbdist.core.reduce import rules as reduction

        return pytree.tree_map(
            lambda leaf: reduction.gather_value(self.extended, leaf, axis),
            value,
            is_leaf=lambda leaf: isinstance(leaf, DistributedValues),
        )

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of `value` on this worker's replicas; a plain value gives `(value,)`.

        Example:
            >>> import nbdist as nd
            >>> nd.OneDeviceStrategy("cpu").experimental_local_results(torch.tensor(1.0))
            (tensor(1.),)
        """
        if isinstance(value, DistributedValues):
            return value.values
        flat, _ = pytree.tree_flatten(value, is_leaf=lambda v: isinstance(v, DistributedValues))
        count = max(
            (len(v.values) for v in flat if isinstance(v, DistributedValues)), default=0
        )  # fmt: skip
        if count == 0:
            return (value,)
        return tuple(select_replica(i, value) for i in range(count))

    def experimental_distribute_values_from_function(self, value_fn: Callable[[Any], Any]) -> Any:
        """Call `value_fn(ValueContext)` for each local replica and return the results.

        Returns:
            A `PerReplica` (the plain value when there is one replica). When `value_fn`
            returns a structure (a dict, list, tuple), as in TensorFlow the structure comes
            back with a `PerReplica` at each leaf, so `strategy.reduce` and `run` take it.

        Raises:
            ValueError: the replicas' values are differently structured.

        Example:
            >>> import nbdist as nd
            >>> s = nd.MirroredStrategy(["cpu:0", "cpu:1"])
            >>> s.experimental_distribute_values_from_function(
            ...     lambda ctx: ctx.replica_id_in_sync_group)
            PerReplica:{0: 0, 1: 1}
            >>> s.experimental_distribute_values_from_function(
            ...     lambda ctx: {"id": ctx.replica_id_in_sync_group, "n": 2})
            {'id': PerReplica:{0: 0, 1: 1}, 'n': PerReplica:{0: 2, 1: 2}}
        """
        from nbdist.input import ValueContext

        ids = self._local_replica_ids
        values = [
            value_fn(ValueContext(replica_id, self.num_replicas_in_sync)) for replica_id in ids
        ]
        if len(values) == 1:
            return values[0]
        return regroup(values, replica_ids=ids, devices=self._devices, always_wrap=True)

    def experimental_distribute_dataset(self, dataset: Iterable[Any], options: Any = None) -> Any:
        """Split every global batch of `dataset` over the replicas (see API §6)."""
        from nbdist import input as input_lib

        return input_lib.distribute_dataset(dataset, options=options, **self._input_placement())

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Iterable[Any]], options: Any = None
    ) -> Any:
        """Build each worker's (or replica's) input pipeline with `dataset_fn(InputContext)`."""
        from nbdist import input as input_lib

        return input_lib.distribute_datasets_from_function(
            dataset_fn, options=options, **self._input_placement()
        )

    def _input_placement(self) -> dict[str, Any]:
        """Where a distributed dataset's batches go: this worker's devices among all replicas."""
        return {
            "devices": self._devices,
            "num_replicas_in_sync": self.num_replicas_in_sync,
            "num_workers": self._num_workers,
            "worker_index": self._worker_index,
        }

    # -- implement these ------------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def _replica_all_reduce(self, ctx: ReplicaContext, op: ReduceOp, value: Any, options) -> Any:
        raise NotImplementedError

    def _replica_all_gather(self, ctx: ReplicaContext, value: Any, axis: int, options) -> Any:
        raise NotImplementedError

    def _replica_merge_call(
        self, ctx: ReplicaContext, merge_fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> Any:
        raise NotImplementedError

    def _create_variable(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _across_workers(self, op: ReduceOp, tensor: torch.Tensor) -> torch.Tensor:
        """Combine this worker's tensor with the other workers' (one worker: itself)."""
        return tensor

    def _gather_across_workers(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Concatenate this worker's tensor with the other workers' along `axis`."""
        return tensor

    def _broadcast_from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        """The first replica's value of `tensor` (other workers receive it)."""
        return tensor

    # -- helpers shared by subclasses -----------------------------------------------------
    @functools.cached_property
    def _local_replica_ids(self) -> tuple[int, ...]:
        """The global replica ids of this worker's replicas (fixed once the strategy is built)."""
        first = self._worker_index * len(self._devices)
        return tuple(range(first, first + len(self._devices)))

    def _communication_options(self, override: Any = None) -> CommunicationOptions:
        return self._options.merge(override)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(devices={list(self._devices)!r})"


@contextlib.contextmanager
def module_registration_hooks(
    hook: Callable[[torch.nn.Module, str, Any], None], *, buffers: bool, submodules: bool
) -> Iterator[None]:
    """Call `hook(module, name, value)` for every parameter (and, when asked, buffer and
    submodule) that any torch module registers while inside: how a strategy's scope captures
    what is created in it (torch's global registration hooks, removed on exit).

    Example:
        >>> seen = []
        >>> with module_registration_hooks(lambda m, n, v: seen.append(n), buffers=False,
        ...                                submodules=False):
        ...     _ = torch.nn.Linear(2, 1)
        >>> seen
        ['weight', 'bias']
    """
    register = torch.nn.modules.module
    handles = [register.register_module_parameter_registration_hook(hook)]
    if buffers:
        handles.append(register.register_module_buffer_registration_hook(hook))
    if submodules:
        handles.append(register.register_module_module_registration_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def check_run_options(options: Any) -> None:
    """Refuse any `Strategy.run(options=...)` other than None, naming what was passed.

    TensorFlow's `tf.distribute.RunOptions` carries TPU/XLA settings only (dynamic batch size,
    shape bucketizing, XLA options); nbdist runs eager PyTorch, so it has none to honour.

    Example:
        >>> check_run_options(None)  # the only accepted value
    """
    if options is None:
        return
    from nbdist.errors import UnsupportedOptionError

    raise UnsupportedOptionError(
        f"strategy.run got options={options!r}, but nbdist supports no run options: "
        "TensorFlow's RunOptions only configure TPU and XLA compilation. Remove the options "
        "argument (per-collective settings such as timeouts go to "
        "ReplicaContext.all_reduce(..., options=nd.experimental.CommunicationOptions(...)))."
    )
