"""`reduce_to`/`batch_reduce_to` of a `MultiWorkerMirroredStrategy`: the strategy's local
replica values combined, then one checked all-reduce across the workers (for a whole batch).

Given what it needs by the strategy (its all-reduce, its group, its compression for given
options), so it reads nothing of the strategy itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nbdist.collectives.torch_dist import DistGroup
from nbdist.core.reduce.cross_device import CrossDeviceOps
from nbdist.core.reduce.op import ReduceOp, as_reducible, refuse_bool
from nbdist.core.values import DistributedValues

__all__ = ["WorkerReduction"]


class WorkerReduction(CrossDeviceOps):
    """`reduce_to`/`batch_reduce_to` across workers: one checked all-reduce for a whole batch."""

    implementation_name = "torch.distributed"

    def __init__(
        self,
        across_workers: Callable[[ReduceOp, torch.Tensor], torch.Tensor],
        group: DistGroup | None,
        compression: Callable[[Any], str | None],
    ):
        super().__init__()
        self._across_workers = across_workers  # the strategy's checked all-reduce
        self._group = group
        self._compression = compression  # options -> the compression to use

    def _local(self, op: ReduceOp, value: Any) -> torch.Tensor:
        if isinstance(value, DistributedValues):
            tensors = [as_reducible(v, "reduce_to") for v in value.values]
            refuse_bool(op, tensors)  # Note [Bool reductions]
            return op.combine(tensors)
        tensor = as_reducible(value, "reduce_to")
        refuse_bool(op, (tensor,))
        return tensor

    def _reduce_tensors(self, op, tensors, destinations):
        local = op.combine(tensors) if len(tensors) > 1 else tensors[0]
        return [self._across_workers(op, local)]

    def reduce(self, reduce_op, per_replica_value, destinations, options=None):
        op = ReduceOp.from_value(reduce_op)
        return self._across_workers(op, self._local(op, per_replica_value))

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        op = ReduceOp.from_value(reduce_op)
        local = [self._local(op, value) for value, _ in value_destination_pairs]
        group = self._group
        if group is None or not local:
            return local
        return group.all_reduce(local, op, compression=self._compression(options))
