"""`ParameterServerStrategy`: variables on ps tasks, functions on workers, the chief decides.

The chief (a notebook or a script) creates the strategy from a cluster with `worker` and `ps`
tasks, creates the model in `scope()` (each parameter, variable or shard is created on ps task
`count % num_ps`), and hands step functions to a `ClusterCoordinator`, which runs each on
whichever worker is free (`worker_task.run_closure`).

Example (needs running ps and worker tasks, so not run here)::

    resolver = nd.cluster_resolver.TFConfigClusterResolver()
    strategy = nd.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = torch.nn.Linear(4, 1)
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist.cluster_resolver import ClusterSpec
from nbdist.core import context
from nbdist.errors import ArgumentTypeError, ClusterConfigError, ContextError
from nbdist.strategies.base import Strategy, module_registration_hooks
from nbdist.strategies.parameter_server.closures import VarSpec
from nbdist.strategies.parameter_server.ps_variables import PSVariable, ShardStore
from nbdist.strategies.parameter_server.variable_placement import Shard, check_partition, shard_rows

__all__ = ["ParameterServerStrategy"]

_FIX = (
    "A ParameterServerStrategy needs a cluster with at least one 'worker' and one 'ps' task, "
    "e.g. ClusterSpec({'chief': ['127.0.0.1:2220'], 'worker': ['127.0.0.1:2221', "
    "'127.0.0.1:2222'], 'ps': ['127.0.0.1:2223']}); from a notebook, "
    "nd.Cluster(n=3, strategy='parameter_server', num_ps=1) starts one."
)


class ParameterServerStrategy(Strategy):
    """Asynchronous training with variables on parameter-server tasks (TF's
    `tf.distribute.experimental.ParameterServerStrategy`).

    Args:
        cluster_resolver: A `ClusterResolver` (or `ClusterSpec`) whose cluster has `worker`
            and `ps` tasks (and usually a `chief`: this process).
        variable_partitioner: None (no variable is split), or a callable
            `(shape, dtype) -> [k, 1, ..., 1]` such as
            `nd.experimental.partitioners.FixedShardsPartitioner(2)`.

    Raises:
        ClusterConfigError: (a `ValueError`) no `ps` or no `worker` task.
        ArgumentTypeError: (a `TypeError`) a partitioner that is not callable.

    Beyond TF: `pull(module)` copies the current values from the ps tasks into the chief's
    tensors (to evaluate or checkpoint there), `push(module)` writes the chief's values to the
    ps tasks (to restore a checkpoint), `placement(tensor)` lists a variable's shards.
    """

    def __init__(self, cluster_resolver: Any, variable_partitioner: Any = None):
        super().__init__()
        spec = cluster_resolver if isinstance(cluster_resolver, ClusterSpec) else None
        if spec is None:
            getter = getattr(cluster_resolver, "cluster_spec", None)
            if not callable(getter):
                raise ArgumentTypeError(
                    "ParameterServerStrategy needs a cluster resolver (e.g. "
                    "nd.cluster_resolver.TFConfigClusterResolver()) or a ClusterSpec, got "
                    f"{cluster_resolver!r}. {_FIX}"
                )
            spec = getter()
        jobs = spec.as_dict() if spec else {}
        for job in ("ps", "worker"):
            if not jobs.get(job):
                raise ClusterConfigError(f"The cluster has no {job!r} task: {jobs}. {_FIX}")
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise ArgumentTypeError(
                "variable_partitioner must be None or a callable (shape, dtype) -> [k, 1, ...], "
                f"got {variable_partitioner!r}; e.g. "
                "nd.experimental.partitioners.FixedShardsPartitioner(2)."
            )
        self._cluster_resolver = cluster_resolver
        self._spec = spec
        self._ps_addresses: list[str] = [str(a) for a in spec.job_tasks("ps")]
        self._worker_addresses: list[str] = [str(a) for a in spec.job_tasks("worker")]
        self._partitioner = variable_partitioner
        self._parameter_devices = tuple(
            f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(len(self._ps_addresses))
        )
        self.timeout = 300.0
        """Seconds a ps read or update may take before the ps counts as unavailable."""
        self.store = ShardStore(self._ps_addresses, lambda: self.timeout)
        """The chief's clients of the ps tasks (what its variables read and write through)."""
        self._specs: dict[int, VarSpec] = {}  # id(object) -> spec
        self._objects: dict[int, Any] = {}  # vid -> object (keeps ids valid)
        self._placements: dict[int, list[Shard]] = {}
        self._count = itertools.count()  # round-robin over ps tasks
        self._ids = itertools.count(1)
        self._names: dict[str, int] = {}
        self._optimizer_ids: dict[int, int] = {}  # id(optimizer) -> its id on the ps tasks
        self._slots_complete: set[int] = set()  # optimizer ids whose state the ps tasks hold
        self.worker_channels: list[Any] | None = None
        """Set by `nd.Cluster`: how to reach each worker (engines); else sockets to the
        worker tasks' addresses (`nd.Server`)."""

    # -- cluster ----------------------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        """The number of worker tasks."""
        return len(self._worker_addresses)

    @property
    def num_ps(self) -> int:
        """The number of ps tasks."""
        return len(self._ps_addresses)

    @property
    def ps_addresses(self) -> tuple[str, ...]:
        """The ps tasks' `host:port` addresses, by task index."""
        return tuple(self._ps_addresses)

    @property
    def worker_addresses(self) -> tuple[str, ...]:
        """The worker tasks' `host:port` addresses, by task index."""
        return tuple(self._worker_addresses)

    # -- scope: variables and module parameters go to the ps tasks ---------------------------
    @contextlib.contextmanager
    def _scope_hooks(self) -> Iterator[None]:
        fresh: list[tuple[str, torch.nn.Parameter]] = []

        def capture(module: torch.nn.Module, name: str, tensor: Any) -> None:
            # Placed now (creation order, as TF), written at scope exit: layers fill their
            # parameters after registering them.
            if (
                isinstance(tensor, torch.nn.Parameter)
                and context.current_scope_strategy() is self
                and id(tensor) not in self._specs
            ):
                fresh.append(
                    (tensor, self._reserve(tensor, name, "parameter", tensor.requires_grad))
                )

        try:
            with module_registration_hooks(capture, buffers=False, submodules=False):
                yield
        finally:
            for param, spec in fresh:
                self.store.assign(spec, param.detach())

    def _create_variable(
        self,
        initial_value: Any,
        trainable: bool | None = None,
        synchronization: Any = None,
        aggregation: Any = None,
        name: str | None = None,
        dtype: torch.dtype | None = None,
        **_: Any,
    ) -> PSVariable:
        if callable(initial_value):
            initial_value = initial_value()
        value = torch.as_tensor(initial_value, dtype=dtype).detach().cpu().clone()
        from nbdist.core.variable_options import (
            VariableAggregation,
            VariableSynchronization,
            option_member,
        )

        sync = option_member(VariableSynchronization, synchronization or "AUTO", "synchronization")
        on_read = sync is VariableSynchronization.ON_READ
        trainable = (not on_read) if trainable is None else bool(trainable)
        # One copy on the ps, which every worker's updates change: read on the chief it is
        # the sum of the workers' updates (the aggregate a sync-on-read variable promises).
        options = {
            "synchronization": sync if on_read else VariableSynchronization.ON_WRITE,
            "aggregation": option_member(VariableAggregation, aggregation or "NONE", "aggregation"),
        }
        return self._place(value, name or "Variable", "variable", trainable, options)

    def _unique(self, name: str) -> str:
        count = self._names.get(name, 0)
        self._names[name] = count + 1
        return name if count == 0 else f"{name}_{count}"

    def _place(
        self, obj: Any, name: str, kind: str, trainable: bool, options: dict | None = None
    ) -> Any:
        spec = self._reserve(obj, name, kind, trainable, options)
        self.store.assign(spec, obj.detach())
        return self._objects[spec.vid]

    def _reserve(
        self, obj: Any, name: str, kind: str, trainable: bool, options: dict | None = None
    ) -> VarSpec:
        """Decide where `obj`'s shards live (round-robin) and remember it; writes nothing.
        A variable (`kind` "variable") is made with `options` (its synchronization and
        aggregation)."""
        tensor = obj.detach()
        shape = tuple(tensor.shape)
        name = self._unique(name)
        k = 1
        if self._partitioner is not None and shape:
            k = check_partition(
                self._partitioner(torch.Size(shape), tensor.dtype), tensor.shape, name
            )
        rows = shard_rows(shape[0], k) if shape and k > 1 else [shape[0] if shape else 0]
        shards, refs, offset = [], [], 0
        split = len(rows) > 1
        for i, count in enumerate(rows):
            ps = next(self._count) % self.num_ps
            shard_shape = (count, *shape[1:]) if split else shape
            shards.append(Shard(f"{name}/part_{i}" if split else name, ps, offset, shard_shape))
            refs.append((ps, next(self._ids), count))
            offset += count
        vid = next(self._ids)
        spec = VarSpec(vid, name, shape, tensor.dtype, trainable, kind, tuple(refs))
        result = (
            obj
            if kind == "parameter"
            else PSVariable(self.store, spec, shards, trainable, **(options or {}))
        )
        self._specs[id(result)] = spec
        self._objects[vid] = result
        self._placements[vid] = shards
        return spec

    # -- beyond TF: the chief's copies ------------------------------------------------------
    def _tracked(self, obj: Any) -> list[tuple[Any, VarSpec]]:
        if isinstance(obj, torch.nn.Module):
            items: list[Any] = list(obj.parameters())
        elif isinstance(obj, (list, tuple)):
            items = list(obj)
        else:
            items = [obj]
        found = [(item, self._specs[id(item)]) for item in items if id(item) in self._specs]
        if not found:
            raise ArgumentTypeError(
                f"{type(obj).__name__} holds no variable of this strategy; pass a module or "
                "variable created in strategy.scope()."
            )
        return found

    def pull(self, obj: Any) -> Any:
        """Copy the current values from the ps tasks into `obj` (a module created in `scope()`,
        a parameter, a list of them, or an optimizer of them: its state) on the chief;
        returns `obj`.

        Example::

            coordinator.join(); strategy.pull(model); accuracy = evaluate(model)
            strategy.pull(optimizer); nd.checkpoint.save(path, model=model, optimizer=optimizer)
        """
        if isinstance(obj, torch.optim.Optimizer):
            from nbdist.strategies.parameter_server import optimizers

            chief = self._chief_optimizer(obj)
            if optimizers.load(chief, self.store.client):
                self._slots_complete.add(chief.oid)
            return obj
        with torch.no_grad():
            for item, spec in self._tracked(obj):
                if isinstance(item, torch.Tensor):
                    item.copy_(self.store.read(spec))
        return obj

    def push(self, obj: Any) -> Any:
        """Write `obj`'s values on the chief to the ps tasks (after restoring a checkpoint into
        the chief's module, or optimizer: its state replaces the ps tasks'); returns `obj`."""
        if isinstance(obj, torch.optim.Optimizer):
            from nbdist.strategies.parameter_server import optimizers

            chief = self._chief_optimizer(obj)
            optimizers.store(chief, self.store.client, overwrite=True)
            if all(obj.state.get(p) for p, _ in chief.params):
                self._slots_complete.add(chief.oid)
            return obj
        for item, spec in self._tracked(obj):
            value = item.detach() if isinstance(item, torch.Tensor) else item.read_value()
            if isinstance(item, torch.Tensor):
                self.store.assign(spec, value)
        return obj

    def placement(self, tensor: Any) -> tuple[Shard, ...]:
        """The shards of a parameter or variable created in `scope()`: name, ps, rows."""
        spec = self._specs.get(id(tensor))
        if spec is None:
            raise ArgumentTypeError(
                f"{type(tensor).__name__} was not created in this strategy's scope."
            )
        return tuple(self._placements[spec.vid])

    def closure_reference(self, obj: Any) -> Any:
        """What travels to a worker instead of `obj` (closures.dumps_closure), else None."""
        if obj is self:
            return ("strategy",)
        if isinstance(obj, torch.optim.Optimizer):
            return self._optimizer_reference(obj)
        spec = self._specs.get(id(obj))
        if spec is not None and self._objects.get(spec.vid) is obj:
            return ("var", spec)
        return None

    def _chief_optimizer(self, optimizer: torch.optim.Optimizer) -> Any:
        """The chief's optimizer as `optimizers.load`/`store` see it (its id on the ps)."""
        from nbdist.strategies.parameter_server.optimizers import WorkerOptimizer

        self._optimizer_reference(optimizer)  # checks it, and gives it an id
        if id(optimizer) not in self._optimizer_ids:
            raise ArgumentTypeError(
                f"{type(optimizer).__name__} trains no parameter created in this strategy's "
                "scope(); pass the optimizer of a model created in strategy.scope()."
            )
        params = [
            (p, self._specs[id(p)]) for group in optimizer.param_groups for p in group["params"]
        ]
        return WorkerOptimizer(self._optimizer_ids[id(optimizer)], optimizer, params)

    def _optimizer_reference(self, optimizer: torch.optim.Optimizer) -> Any:
        """An optimizer of this strategy's parameters travels as a reference: its state lives
        on the ps tasks with the parameters (`optimizers`), so it lasts across functions."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        ours = [id(p) in self._specs for p in params]
        if not any(ours):
            return None  # an optimizer of other tensors travels by value, as before
        if not all(ours):
            raise ArgumentTypeError(
                f"{type(optimizer).__name__} trains both parameters created in this "
                "ParameterServerStrategy's scope() and others: its state cannot live on the ps "
                "tasks. Create the model in strategy.scope() and give the optimizer only its "
                "parameters."
            )
        from nbdist.strategies.parameter_server.optimizers import OptimizerRef

        oid = self._optimizer_ids.get(id(optimizer))
        if oid is None:
            oid = self._optimizer_ids[id(optimizer)] = next(self._ids)
            self._objects[oid] = optimizer  # keeps the id valid
        state = optimizer.__getstate__()
        if oid in self._slots_complete:
            # The ps tasks hold every parameter's state (pulled or pushed): the chief's copy
            # would be overwritten on the worker, so it does not travel.
            state = {**state, "state": collections.defaultdict(dict)}
        return ("optimizer", OptimizerRef(oid, type(optimizer), state))

    # -- run happens on workers ---------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        raise ContextError(
            "ParameterServerStrategy.run runs on a worker: call it inside a function passed to "
            "coordinator.schedule(fn), where coordinator = "
            "nd.experimental.coordinator.ClusterCoordinator(strategy)."
        )

    def close(self) -> None:
        """Close this process's connections to the ps tasks."""
        self.store.close()

    def __repr__(self) -> str:
        return (
            f"<nbdist.ParameterServerStrategy: {self.num_workers} worker(s), {self.num_ps} ps "
            f"task(s) {self._ps_addresses}>"
        )
