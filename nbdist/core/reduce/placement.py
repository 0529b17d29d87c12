"""What the cross-replica rules need from a strategy: where its replicas are (`Placement`) and
how its workers talk (`WorkerCommunication`).

`nbdist.core.reduce.rules`, `nbdist.core.variables` and the checkpoints use only this interface (a
strategy's `extended` implements it), never a strategy's private members, so the core does not
depend on the strategies. `SingleWorker` implements it for values that are all in one process
(the notebook's view of an engine cluster's results). Imports core modules only.

Example:
    >>> import torch
    >>> workers = SingleWorker(Placement(devices=("cpu:0", "cpu:1")))
    >>> workers.placement.num_replicas_in_sync, workers.across_workers("sum", torch.ones(1))
    (2, tensor([1.]))
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nbdist._lazy_module import LazyModule
from nbdist.core.reduce.cross_device import CrossDeviceOps, ReductionToOneDevice
from nbdist.core.reduce.op import ReduceOp
from nbdist.core.reduce.options import CommunicationOptions

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")  # imported at first use: not on `Cluster.start()`'s path

__all__ = ["Placement", "SingleWorker", "WorkerCommunication"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a strategy's replicas compute and its variables live.

    Attributes:
        devices: This worker's replica devices, one per local replica.
        parameter_devices: Where variables are placed (one device for CentralStorage).
        num_workers: Worker processes taking part (1 for single-process strategies).
        worker_index: This worker's index (its rank).
    """

    devices: tuple[str, ...]
    parameter_devices: tuple[str, ...] = ("cpu:0",)
    num_workers: int = 1
    worker_index: int = 0

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas of all workers."""
        return len(self.devices) * self.num_workers

    @property
    def local_replica_ids(self) -> tuple[int, ...]:
        """The replica ids of this worker's replicas."""
        first = self.worker_index * len(self.devices)
        return tuple(range(first, first + len(self.devices)))


@runtime_checkable
class WorkerCommunication(Protocol):
    """The strategy interface of the cross-replica rules (`strategy.extended` implements it).

    Context: cross-replica. Every method that talks to other workers is a collective: every
    worker calls it, in the same order.
    """

    @property
    def placement(self) -> Placement:
        """Where the replicas are."""
        ...

    def across_workers(self, reduce_op: ReduceOp | str, tensor: torch.Tensor) -> torch.Tensor:
        """Combine this worker's `tensor` with the other workers' (one worker: itself)."""
        ...

    def gather_across_workers(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Concatenate this worker's `tensor` with the other workers' along `axis`."""
        ...

    def broadcast_from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        """The first worker's value of `tensor`."""
        ...

    def reduction_ops(self) -> CrossDeviceOps:
        """The algorithm that reduces across this worker's devices."""
        ...

    def communication_options(self, override: Any = None) -> CommunicationOptions:
        """The strategy's communication options, with `override`'s settings applied."""
        ...


class SingleWorker:
    """`WorkerCommunication` for replicas that are all in this process (nothing to exchange)."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self._ops = ReductionToOneDevice()

    def across_workers(self, reduce_op: ReduceOp | str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself: there are no other workers."""
        return tensor

    def gather_across_workers(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """`tensor` itself: there are no other workers."""
        return tensor

    def broadcast_from_first(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself: this is the first worker."""
        return tensor

    def reduction_ops(self) -> CrossDeviceOps:
        """Reduction to one device."""
        return self._ops

    def communication_options(self, override: Any = None) -> CommunicationOptions:
        """Default options, with `override`'s applied."""
        return CommunicationOptions().merge(override)
