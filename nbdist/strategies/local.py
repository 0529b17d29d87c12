"""Replicas as threads of one process: the machinery of the default, one-device, mirrored and
central-storage strategies.

Replica 0 runs on the calling thread and the others on a small pool of long-lived threads, each
in its own copy of the caller's `contextvars` (see Note [Local rendezvous] for collectives and
Note [Replica views] for modules).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist._private_api import pytree
from nbdist.collectives.local import LocalGroup
from nbdist.core import context
from nbdist.core.devices import physical_device
from nbdist.core.reduce.cross_device import CrossDeviceOps, NcclAllReduce
from nbdist.core.reduce.op import ReduceOp, as_reducible, refuse_bool
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.core.values import regroup, select_replica
from nbdist.core.variables import (
    Variable,
    VariableAggregation,
    VariableSynchronization,
    colocation_devices,
    create_distributed_variable,
    option_member,
    single_variable,
)
from nbdist.errors import (
    BusyError,
    CollectiveMismatchError,
    ContextError,
    InvalidArgumentError,
    ReplicaReleasedError,
)
from nbdist.strategies._compiled import (
    ParameterInRunError,
    clear_gradients_eagerly,
    eager_between_graphs,
    translate_compile_error,
)
from nbdist.strategies._replicas import ReplicaParameters
from nbdist.strategies.base import ReplicaContext, Strategy, module_registration_hooks

__all__ = ["LocalStrategy"]


class LocalStrategy(Strategy):
    """A strategy whose replicas are devices of this process (one thread per replica).

    Subclasses choose the devices, where variables live and the cross-device ops.
    """

    _central_storage = False

    def __init__(
        self,
        devices: tuple[str, ...],
        parameter_devices: tuple[str, ...],
        cross_device_ops: CrossDeviceOps | None,
        options: CommunicationOptions | None = None,
    ):
        super().__init__()
        self._devices = devices
        self._parameter_devices = parameter_devices
        self._options = options or CommunicationOptions()
        self._cross_device_ops = cross_device_ops
        if cross_device_ops is not None:
            cross_device_ops.check_devices(devices)
            cross_device_ops.telemetry = self._telemetry
            cross_device_ops.num_replicas_hint = len(devices)
        self._group = LocalGroup(
            len(devices), timeout=self._options.timeout, telemetry=self._telemetry
        )
        self._replicas = ReplicaParameters(
            devices, central=self._central_storage, group=self._group
        )
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._streams: dict[int, Any] = {}
        # Note [One run at a time]: the replicas of a strategy with several devices share one
        # rendezvous (its collectives are numbered per run) and one pool of threads, so two
        # threads' `run` calls would pair each other's collectives (wrong values, replicas
        # that disagree) and then deadlock. A second call waits its turn, up to the strategy's
        # collective timeout, then raises `BusyError`. A strategy with one device shares
        # nothing between calls, so its calls run side by side.
        self._run_lock = threading.Lock()
        self._running_in: str | None = None

    # -- scope: capture modules -----------------------------------------------------------
    @contextlib.contextmanager
    def _scope_hooks(self) -> Iterator[None]:
        capture = module_registration_hooks(self._on_registration, buffers=True, submodules=True)
        try:
            with capture, self._default_device(self._parameter_devices[0]):
                yield
        finally:
            if self._is_multi_replica:
                self._replicas.synchronize()

    def _on_registration(self, module: torch.nn.Module, name: str, tensor: Any) -> None:
        if (
            self._is_multi_replica
            and context.current_scope_strategy() is self
            and context.current_replica_context() is None
        ):
            # A compiled step must not trace zero_grad (docs/compile.md); submodules come here
            # too, so a model built of layers gets it on every level.
            clear_gradients_eagerly(module)
            if isinstance(tensor, torch.Tensor):
                self._replicas.capture(tensor, sync_gradients=self._sync_gradients)

    @contextlib.contextmanager
    def _default_device(self, device: str) -> Iterator[None]:
        target = physical_device(device)
        if target.type == "cpu":
            yield
            return
        with torch.device(target):
            yield

    # -- run ------------------------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        count = len(self._devices)
        grad_enabled = torch.is_grad_enabled()
        if count == 1:
            ctx = ReplicaContext(self, self._local_replica_ids[0], 0)
            try:
                with context.enter_replica_context(ctx), self._replica_device(0):
                    return fn(
                        *select_replica(0, args, replicas=1),
                        **select_replica(0, kwargs, replicas=1),
                    )
            except RuntimeError as error:
                translated = translate_compile_error(error, ctx.replica_id_in_sync_group)
                if translated is error:
                    raise
                raise translated from None
        # Note [One run at a time]; plain calls, not context managers: this is every run's path.
        if not self._run_lock.acquire(timeout=self._options.timeout):
            raise self._busy()
        self._running_in = threading.current_thread().name
        key = context.begin_threaded_run(self)
        try:
            return self._run_replicas(fn, args, kwargs, count, grad_enabled)
        finally:
            context.end_threaded_run(key)
            self._running_in = None
            self._run_lock.release()

    def _busy(self) -> BusyError:
        return BusyError(
            f"{type(self).__name__}.run waited {self._options.timeout:g} s for another "
            f"thread's run on this strategy (from thread {self._running_in!r}) to finish, and "
            "was not run. Calls to one strategy from several threads run one at a time: wait "
            "for that call, call run from one thread, or raise the timeout with "
            "CommunicationOptions(timeout_seconds=...)."
        )

    def _run_replicas(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, count: int, grad_enabled: bool
    ) -> Any:
        self._group.begin_run()
        self._replicas.synchronize()
        self._replicas.active = True
        refuse = torch.nn.modules.module.register_module_parameter_registration_hook(
            self._refuse_parameter_in_run
        )
        try:
            pool = self._thread_pool(count - 1)
            futures = [
                pool.submit(
                    contextvars.copy_context().run, self._replica_main, k, fn, args, kwargs,
                    grad_enabled,
                )
                for k in range(1, count)
            ]  # fmt: skip
            outcomes: list[tuple[bool, Any, float]] = [
                contextvars.copy_context().run(
                    self._replica_main, 0, fn, args, kwargs, grad_enabled
                )
            ]
            outcomes += [future.result() for future in futures]
        finally:
            refuse.remove()
            self._replicas.active = False
        failures = [(when, k, value) for k, (ok, value, when) in enumerate(outcomes) if not ok]
        if failures:
            raise _first_failure(failures, count)
        return regroup(
            [value for _, value, _ in outcomes],
            replica_ids=self._local_replica_ids,
            devices=self._devices,
        )

    def _replica_main(
        self, k: int, fn: Callable[..., Any], args: tuple, kwargs: dict, grad_enabled: bool
    ) -> tuple[bool, Any, float]:
        ctx = ReplicaContext(self, self._local_replica_ids[k], k)
        try:
            with (
                context.enter_replica_context(ctx),
                torch.set_grad_enabled(grad_enabled),
                self._replica_device(k),
                self._replica_view(k),
            ):
                count = len(self._devices)
                result = fn(
                    *select_replica(k, args, replicas=count),
                    **select_replica(k, kwargs, replicas=count),
                )
        except BaseException as error:
            error = translate_compile_error(error, ctx.replica_id_in_sync_group)
            self._group.replica_failed(k, error)
            return False, error, time.monotonic()
        self._group.replica_finished(k)
        return True, result, 0.0

    @eager_between_graphs
    def _refuse_parameter_in_run(self, module: torch.nn.Module, name: str, param: Any) -> None:
        replica = context.current_replica_context()
        if replica is None or replica.strategy is not self or param is None:
            return
        if type(module).__module__.startswith(("torch._", "torch.fx")):
            return  # torch.compile's own modules (Dynamo's FakeRootModule, fx GraphModules)
        raise ParameterInRunError(
            f"Replica {replica.replica_id_in_sync_group}: {type(module).__name__} registered "
            f"parameter {name!r} inside strategy.run (compiled or not). Each of the "
            f"{len(self._devices)} replicas would get its own parameter, never synchronised. "
            "Create modules and parameters in strategy.scope(), outside run (and outside the "
            "compiled step), and use them inside."
        )

    @contextlib.contextmanager
    def _replica_view(self, k: int) -> Iterator[None]:
        mode = self._replicas.view(k)
        if mode is None:
            yield
            return
        with mode:
            yield

    @contextlib.contextmanager
    def _replica_device(self, k: int) -> Iterator[None]:
        target = physical_device(self._devices[k])
        if target.type != "cuda":
            yield
            return
        stream = self._streams.get(k)
        if stream is None:
            stream = self._streams[k] = torch.cuda.Stream(device=target)
        with torch.cuda.device(target), torch.cuda.stream(stream), torch.device(target):
            yield
        stream.synchronize()

    def _thread_pool(self, workers: int) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="nbdist-replica"
            )
        return self._pool

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    # -- collectives ----------------------------------------------------------------------
    def _replica_all_reduce(self, ctx: ReplicaContext, op: ReduceOp, value: Any, options) -> Any:
        leaves, spec = pytree.tree_flatten(value)
        tensors = [
            leaf if isinstance(leaf, torch.Tensor) else as_reducible(leaf, "all_reduce")
            for leaf in leaves
        ]
        refuse_bool(op, tensors)  # Note [Bool reductions]
        if len(self._devices) == 1:
            return value
        ops = self._cross_ops()
        devices = self._devices
        # Reduce once onto the first device; each replica copies its own result in parallel
        # (`finish`), except NCCL, which leaves a result on every device itself.
        targets = devices if isinstance(ops, NcclAllReduce) else devices[:1]

        def reduce_onto(payloads: list[list[torch.Tensor]], onto: tuple[str, ...]) -> list:
            per_value = [
                [payloads[r][i] for r in range(len(payloads))] for i in range(len(tensors))
            ]
            out: list[list[Any]] = [[None] * len(per_value) for _ in onto]
            groups: dict[torch.dtype, list[int]] = {}
            for i, column in enumerate(per_value):
                groups.setdefault(column[0].dtype, []).append(i)
            for indices in groups.values():
                reduced = ops.reduce_packed(op, [per_value[i] for i in indices], onto)
                for i, per_device in zip(indices, reduced):
                    for r, tensor in enumerate(per_device):
                        out[r][i] = tensor
            return out

        if len(devices) == 2 and not isinstance(ops, NcclAllReduce):
            # Two replicas: each computes the (same, same-order) reduction itself, in parallel,
            # instead of one reducing and the other copying.
            def combine(payloads: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
                _check_alike("all_reduce", payloads)
                return payloads

            def finish(payloads: list[list[torch.Tensor]], r: int) -> list[torch.Tensor]:
                return reduce_onto(payloads, (devices[r],))[0]

        else:

            def combine(payloads: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
                _check_alike("all_reduce", payloads)
                return reduce_onto(payloads, targets)

            def finish(shared: list[list[torch.Tensor]], r: int) -> list[torch.Tensor]:
                if len(shared) > 1 or r == 0:
                    return shared[r if len(shared) > 1 else 0]
                target = physical_device(devices[r])
                return [t.to(target, copy=True) for t in shared[0]]

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        result = self._group.exchange(
            ctx.local_replica_index, f"all_reduce:{op.value}", tensors, combine, finish,
            nbytes=nbytes, implementation=ops.implementation_name,
            timeout=self._timeout(options),
        )  # fmt: skip
        return pytree.tree_unflatten(result, spec)

    def _replica_all_gather(self, ctx: ReplicaContext, value: Any, axis: int, options) -> Any:
        leaves, spec = pytree.tree_flatten(value)
        tensors = [
            leaf if isinstance(leaf, torch.Tensor) else as_reducible(leaf, "all_gather")
            for leaf in leaves
        ]
        for tensor in tensors:
            if tensor.dim() == 0 or not -tensor.dim() <= axis < tensor.dim():
                raise InvalidArgumentError(
                    f"all_gather along axis {axis} needs values of rank > {axis}, got shape "
                    f"{tuple(tensor.shape)}. Reshape scalars with tensor.reshape(1)."
                )
        if len(self._devices) == 1:
            return value
        devices = self._devices

        def combine(payloads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
            _check_alike("all_gather", payloads, except_axis=axis)
            first = physical_device(devices[0])
            return [
                torch.cat([p[i].to(first) for p in payloads], dim=axis)
                for i in range(len(payloads[0]))
            ]

        def finish(shared: list[torch.Tensor], r: int) -> list[torch.Tensor]:
            target = physical_device(devices[r])
            return [t.to(target, copy=r > 0) for t in shared]

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        result = self._group.exchange(
            ctx.local_replica_index, f"all_gather:{axis}", tensors, combine, finish,
            nbytes=nbytes, timeout=self._timeout(options),
        )  # fmt: skip
        return pytree.tree_unflatten(result, spec)

    def _replica_merge_call(
        self, ctx: ReplicaContext, merge_fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> Any:
        if len(self._devices) == 1:
            with context.enter_replica_context(None):
                return merge_fn(self, *args, **kwargs)

        def combine(payloads: list[tuple[tuple, dict]]) -> Any:
            merged_args, merged_kwargs = regroup(
                payloads, replica_ids=self._local_replica_ids, devices=self._devices
            )
            with context.enter_replica_context(None):
                return merge_fn(self, *merged_args, **merged_kwargs)

        return self._group.exchange(
            ctx.local_replica_index, "merge_call", (args, kwargs), combine,
            lambda shared, r: select_replica(r, shared),
        )  # fmt: skip

    def _timeout(self, options: Any) -> float:
        if isinstance(options, CommunicationOptions) and options.timeout_seconds is not None:
            return options.timeout
        return self._options.timeout

    def _cross_ops(self) -> CrossDeviceOps:
        return self.extended.reduction_ops()

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
        if not self._is_multi_replica:
            return single_variable(
                initial_value, trainable,
                option_member(VariableSynchronization, synchronization, "synchronization"),
                option_member(VariableAggregation, aggregation, "aggregation"), name or "Variable",
                dtype, (colocation_devices() or self._parameter_devices)[0],
            )  # fmt: skip
        if context.current_replica_context() is not None:
            raise ContextError(
                f"Variable {name or 'Variable'!r} was created inside strategy.run. Create "
                "variables (and modules) in strategy.scope(), outside run, so every replica "
                "shares them."
            )
        return create_distributed_variable(
            self,
            lambda on_read: self._devices if on_read else self._parameter_devices,
            initial_value, trainable, synchronization, aggregation, name, dtype,
        )  # fmt: skip


def _check_alike(what: str, payloads: list[list[torch.Tensor]], except_axis: int | None = None):
    def signature(tensors: list[torch.Tensor]) -> list[tuple]:
        out = []
        for t in tensors:
            shape = list(t.shape)
            if except_axis is not None and shape:
                shape[except_axis] = "*"
            out.append((tuple(shape), t.dtype))
        return out

    first = signature(payloads[0])
    for r, payload in enumerate(payloads[1:], start=1):
        mine = signature(payload)
        if mine != first:
            raise CollectiveMismatchError(
                f"{what} got different values on different replicas: replica 0 passed "
                f"{_describe(payloads[0])} but replica {r} passed {_describe(payload)}. Every "
                "replica must pass tensors of the same shapes and dtypes"
                + (f" (except along axis {except_axis})." if except_axis is not None else ".")
            )


def _describe(tensors: list[torch.Tensor]) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in tensors)


def _first_failure(failures: list[tuple[float, int, BaseException]], count: int) -> BaseException:
    primary = [f for f in failures if not isinstance(f[2], ReplicaReleasedError)] or failures
    _, replica, error = min(primary, key=lambda f: f[1])
    _label(error, replica, count)
    return error


def _label(error: BaseException, replica: int, count: int) -> None:
    """Put the replica id in the exception's message (its type and traceback are kept)."""
    if getattr(error, "replica_id", None) is not None:
        return
    prefix = f"[replica {replica} of {count}] "
    if error.args and isinstance(error.args[0], str):
        error.args = (prefix + error.args[0], *error.args[1:])
    elif not error.args:
        error.args = (prefix.strip(),)
    else:
        error.args = (f"{prefix}{error.args[0]!r}", *error.args[1:])
    with contextlib.suppress(AttributeError):
        error.replica_id = replica  # type: ignore[attr-defined]
