"""`StrategyExtended` (`strategy.extended`): the strategy's devices, placement, replicas and
cross-worker collectives, for code that must know how values are distributed.

A thin view of its strategy: each member reads the strategy's state or calls the hook that each
strategy implements (TF's layering), and it is the one public way in to them: checkpoints,
variables and the reduction rules read `extended.placement`, `extended.replicas`, … , never the
strategy's private members. Imports core modules only (not `nbdist.strategies.base`, which
imports it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from nbdist.core.reduce.cross_device import (
    CrossDeviceOps,
    ReductionToOneDevice,
    resolve_destinations,
)
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.core.reduce.placement import Placement
from nbdist.telemetry.records import Telemetry

__all__ = ["StrategyExtended"]


class StrategyExtended:
    """Additional APIs for algorithms that need to be distribution-aware (`strategy.extended`).

    A thin view of its strategy: every method calls the strategy's machinery.

    Example:
        >>> import nbdist as nd
        >>> nd.MirroredStrategy(["cpu:0", "cpu:1"]).extended.worker_devices
        ('cpu:0', 'cpu:1')
    """

    def __init__(self, strategy: Any):  # a `Strategy`
        self._strategy = strategy

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """Devices used to compute replicas on this worker."""
        return self._strategy._devices

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """Devices used to place variables."""
        return self._strategy._parameter_devices

    @property
    def experimental_require_static_shapes(self) -> bool:
        """False: PyTorch replicas accept any shape (partial last batches included)."""
        return False

    @property
    def should_checkpoint(self) -> bool:
        """True on the worker that should save checkpoints (the first worker), as in TF."""
        return self._strategy._worker_index == 0

    @property
    def should_save_summary(self) -> bool:
        """True on the worker that should write summaries (the first worker), as in TF."""
        return self._strategy._worker_index == 0

    @property
    def should_init(self) -> bool:
        """True: every worker initialises its variables (they are broadcast from the first)."""
        return True

    @property
    def telemetry(self) -> Telemetry:
        """The record of this strategy's collectives (read by dashboards)."""
        return self._strategy._telemetry

    @property
    def cross_device_ops(self) -> CrossDeviceOps | None:
        """The algorithm that reduces across this worker's devices."""
        return self._strategy._cross_device_ops

    def create_variable(self, *args: Any, **kwargs: Any) -> Any:
        """The variable `nd.Variable(*args, **kwargs)` makes in this strategy's scope (a
        `MirroredVariable`, `SyncOnReadVariable`, ps variable, … ; arguments checked)."""
        return self._strategy._create_variable(*args, **kwargs)

    @property
    def replicas(self) -> Any:
        """The `ReplicaParameters` (nbdist.strategies._replicas) holding every local replica's
        copy of the parameters captured in scope (in-process strategies: Mirrored, OneDevice,
        CentralStorage); None for the others (one replica per process)."""
        return self._strategy._replicas

    # -- WorkerCommunication: the interface of the cross-replica rules
    # (nbdist.core.reduce.placement) ----
    @property
    def placement(self) -> Placement:
        """Where the replicas compute and the variables live, on every worker."""
        s = self._strategy
        return Placement(s._devices, s._parameter_devices, s._num_workers, s._worker_index)

    def across_workers(self, reduce_op: ReduceOp | str, tensor: torch.Tensor) -> torch.Tensor:
        """Combine this worker's `tensor` with the other workers' (one worker: itself).

        Context: cross-replica; a collective on multi-worker strategies (every worker calls it).
        """
        return self._strategy._across_workers(ReduceOp.from_value(reduce_op), tensor)

    def gather_across_workers(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Concatenate this worker's `tensor` with the other workers' along `axis` (lengths
        along `axis` may differ). Context: as `across_workers`."""
        return self._strategy._gather_across_workers(tensor, axis)

    def broadcast_from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        """The first worker's value of `tensor`. Context: as `across_workers`."""
        return self._strategy._broadcast_from_first(tensor)

    def reduction_ops(self) -> CrossDeviceOps:
        """The algorithm `reduce_to` and `batch_reduce_to` use (reduction to one device when
        the strategy has none)."""
        s = self._strategy
        ops = s._cross_device_ops
        if ops is None:
            ops = ReductionToOneDevice()
            ops.telemetry = s._telemetry
            s._cross_device_ops = ops
        ops.num_replicas_hint = s.num_replicas_in_sync
        return ops

    def communication_options(self, override: Any = None) -> CommunicationOptions:
        """The strategy's communication options with `override`'s settings applied."""
        return self._strategy._communication_options(override)

    def reduce_to(
        self, reduce_op: ReduceOp | str, value: Any, destinations: Any, options: Any = None
    ) -> Any:
        """Reduce `value` to `destinations` (a device, devices or a variable).

        Context: cross-replica (inside `run`, call it from a `merge_call` function).
        """
        from nbdist.core.reduce import rules as reduction

        return reduction.reduce_to(self, reduce_op, value, destinations, options)

    def batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: Any = None,
    ) -> list[Any]:
        """Many `reduce_to` calls in one communication (tensors packed into buckets)."""
        from nbdist.core.reduce import rules as reduction

        return reduction.batch_reduce_to(self, reduce_op, value_destination_pairs, options)

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Mirror `tensor` onto `destinations`."""
        ops = self._strategy._cross_device_ops
        if ops is None:
            return tensor
        return ops.broadcast(torch.as_tensor(tensor), resolve_destinations(destinations))

    def update(
        self,
        var: Any,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
        """Run `fn(component, *args)` for each component of `var`, on its device.

        Distributed arguments are unwrapped to the component's device. Context: cross-replica
        or update.

        Returns:
            With `group`, a `Mirrored` of the results (the result itself for one component);
            else the tuple of results.
        """
        from nbdist.core.reduce import rules as reduction

        return reduction.update(self, var, fn, tuple(args), dict(kwargs or {}), group)

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Variables created inside land on the same devices as `colocate_with_variable`."""
        from nbdist.core import variables

        with variables.colocated_with(colocate_with_variable):
            yield
