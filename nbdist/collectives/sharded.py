"""The collectives of sharded data parallelism (FSDP2's all-gather and reduce-scatter), run
through the group's bookkeeping: numbered, recorded (`nd.debug.compare_collectives`), shown
in progress on the dashboard's stuck view, timed into the telemetry, and diagnosed (a missing
rank named) when they fail, as every other collective of a `DistGroup`.

FSDP2 calls them through the objects that `FSDPModule.set_custom_all_gather` and
`set_custom_reduce_scatter` accept (`FsdpAllGather`, `FsdpReduceScatter`: `allocate` a buffer,
then `__call__`). They run synchronously: FSDP2 issues its all-gathers synchronously unless
`unshard(async_op=True)` is called by hand, and its reduce-scatters always; on a GPU the
copy-in and the collective still run on FSDP2's own streams, so overlap with compute is kept.

Example (on every rank of a `DistGroup` `group`; what `FullyShardedStrategy` does)::

    unit.set_custom_all_gather(FsdpAllGather(group))
    unit.set_custom_reduce_scatter(FsdpReduceScatter(group))
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["FsdpAllGather", "FsdpReduceScatter", "ShardedCollectives"]

# torch 2.13 names them `*_single` (the `*_tensor` names warn that they are deprecated);
# earlier releases have only the `*_tensor` names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ShardedCollectives:
    """The sharded collectives part of `DistGroup` (see the module docstring); not used alone."""

    _books: Any
    timeout: float
    backend: str

    def all_gather_into(self, output: torch.Tensor, shard: torch.Tensor, group: Any) -> None:
        """Every rank's `shard`, concatenated in rank order, into the flat `output`."""
        nbytes = shard.numel() * shard.element_size()
        start = time.perf_counter()
        self._books.run(
            "all_gather:shards",
            lambda async_op: self._staged(
                output, shard, lambda o, i: _ALL_GATHER(o, i, group=group, async_op=async_op)
            ),
            None,
            self.timeout,
            (tuple(shard.shape), shard.dtype, nbytes),
        )
        self._books.record("all_gather:shards", nbytes, start)

    def reduce_scatter_into(
        self, output: torch.Tensor, full: torch.Tensor, op: Any, group: Any
    ) -> None:
        """Reduce the flat `full` over the ranks with `op`; this rank's slice into `output`."""
        what = f"reduce_scatter:{str(op).rsplit('.', 1)[-1]}"
        nbytes = full.numel() * full.element_size()
        start = time.perf_counter()
        self._books.run(
            what,
            lambda async_op: self._staged(
                output,
                full,
                lambda o, i: _REDUCE_SCATTER(o, i, op=op, group=group, async_op=async_op),
            ),
            None,
            self.timeout,
            (tuple(full.shape), full.dtype, nbytes),
        )
        self._books.record(what, nbytes, start)


    def _staged(self, output: torch.Tensor, source: torch.Tensor, run: Any) -> Any:
        """`run(output, source)`; with gloo and CUDA tensors (workers sharing one GPU, where
        NCCL refuses) through host copies, since gloo's collectives work on host memory."""
        if self.backend != "gloo" or output.device.type != "cuda":
            return run(output, source)
        host = torch.empty(output.shape, dtype=output.dtype)
        work = run(host, source.cpu())
        if work is not None:
            work.wait()
        output.copy_(host)
        return None


class _Allocating:
    def __init__(self, group: ShardedCollectives):
        self.group = group

    def allocate(
        self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A fresh buffer for one collective (FSDP2's default allocation)."""
        return torch.empty(size, dtype=dtype, device=device)


class FsdpAllGather(_Allocating):
    """FSDP2's all-gather through `group.all_gather_into` (duck-types FSDP2's `AllGather`)."""

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
        async_op: bool = False,
    ) -> None:  # fmt: skip
        self.group.all_gather_into(output_tensor, input_tensor, group)


class FsdpReduceScatter(_Allocating):
    """FSDP2's reduce-scatter through `group.reduce_scatter_into` (duck-types FSDP2's
    `ReduceScatter`)."""

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
        op: Any = dist.ReduceOp.SUM, async_op: bool = False,
    ) -> None:  # fmt: skip
        self.group.reduce_scatter_into(output_tensor, input_tensor, op, group)
