"""Gradient averaging across worker processes, bucketed and overlapping the backward pass.

Note [Gradient buckets]: parameters are packed, in reverse creation order (roughly the order
backward produces their gradients), into flat buckets of `bytes_per_pack` bytes (on a GPU the
first bucket is 1 MiB, as DDP's, so communication starts early; Note [CPU buckets]). A hook
fires when a parameter's gradient is accumulated; when every gradient of a bucket is in, the bucket
is copied into its flat buffer (cast to fp16/bf16 under compression) and an asynchronous
all-reduce starts while backward goes on. Buckets start strictly in index order on every rank,
so the collectives always match. A callback at the end of backward starts what is left
(unused parameters count as zero), waits for all of it, and writes the averages back, so
`optimizer.step()` and gradient clipping see averaged gradients.

Note [CPU buckets]: DDP's small first bucket exists so that a GPU's communication stream starts
while backward still computes. On the CPU (gloo) that early start bought nothing in any
measurement, and a second collective costs its fixed latency: CPU parameters go into buckets of
`bytes_per_pack` from the first one. A bucket closes once it holds its size or more, as DDP's.
Measured on 2 and 16 cores: benchmarks/results/recorded/cpu-buckets.json. A smaller
`CommunicationOptions(bytes_per_pack=...)` still splits them.

Note [Not DDP's reducer]: these Python buckets, not `DistributedDataParallel`'s C++ reducer
with a comm hook. DDP's reducer averages a backward only after a forward through the DDP
wrapper (its forward arms the reducer, `prepare_for_backward`); nbdist averages every
backward through the parameters made in scope (Note [Backward outside run] in
`nbdist.strategies.multi_worker`: modules called directly, several models, `sync_gradients`,
compression). And keeping the telemetry and the collective recorder on DDP's path needs a
Python comm hook per bucket, which costs what these hooks cost: measured on the demo's CNN,
benchmarks/results/recorded/not-ddps-reducer.json (docs/architecture.md, "The data path of a
gradient").
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import torch

from nbdist._private_api import foreach, queue_backward_callback
from nbdist.strategies._compiled import eager_between_graphs

if TYPE_CHECKING:
    from nbdist.collectives.torch_dist import DistGroup

__all__ = ["GradientBuckets"]

_FIRST_BUCKET_BYTES = 1024 * 1024
_DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclasses.dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    views: list[torch.Tensor]  # one view of `buffer` per parameter, shaped like it
    group: int = 0  # buckets of parameters captured by one scope exit form a group
    ready: int = 0
    work: Any = None


def first_bucket_bytes(device: torch.device, bytes_per_pack: int) -> int:
    """The size at which the first bucket (the last layers' gradients) closes: 1 MiB on a GPU,
    as DDP's, `bytes_per_pack` on the CPU (Note [CPU buckets]).

    >>> first_bucket_bytes(torch.device("cuda", 0), 25 << 20) == 1 << 20
    True
    >>> first_bucket_bytes(torch.device("cpu"), 25 << 20) == 25 << 20
    True
    """
    if device.type == "cpu":
        return bytes_per_pack
    return min(_FIRST_BUCKET_BYTES, bytes_per_pack)


class GradientBuckets:
    """Average the gradients of a set of parameters across all ranks after each backward.

    Context: built in cross-replica context when a strategy's scope exits; averages every
    backward through its parameters, inside `strategy.run` or not (Note [Backward outside
    run] in `nbdist.strategies.multi_worker`). Hangs if: never (collectives are checked and
    timed by `DistGroup`: a backward on some workers only fails after the collective timeout).
    """

    def __init__(self, group: DistGroup, *, bytes_per_pack: int = 0, compression: str | None):
        self.group = group
        self.bytes_per_pack = bytes_per_pack or _DEFAULT_BUCKET_BYTES
        self.compression = compression
        self.buckets: list[_Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}
        self._launched = 0
        self._groups = 0
        self._touched: set[int] = set()
        self._pending = False
        self._start = 0.0

    def holds_any(self, params: list[torch.Tensor]) -> bool:
        """True when one of `params` has a place in a bucket (it was added)."""
        return any(id(p) in self._where for p in params)

    def add(self, params: list[torch.nn.Parameter]) -> None:
        """Put new parameters into buckets and hook their gradient accumulation."""
        fresh = [p for p in params if p.requires_grad and id(p) not in self._where]
        current: list[torch.nn.Parameter] = []
        size = 0
        limit = self.bytes_per_pack
        if fresh and not self.buckets:
            limit = first_bucket_bytes(fresh[-1].device, self.bytes_per_pack)
        for param in reversed(fresh):
            if current and (param.dtype != current[0].dtype or param.device != current[0].device):
                self._make_bucket(current)
                current, size, limit = [], 0, self.bytes_per_pack
            current.append(param)
            size += param.numel() * param.element_size()
            if size >= limit:  # as DDP: a bucket closes once it holds `limit` bytes or more
                self._make_bucket(current)
                current, size, limit = [], 0, self.bytes_per_pack
        if current:
            self._make_bucket(current)
        self._groups += 1

    def _make_bucket(self, params: list[torch.nn.Parameter]) -> None:
        offsets, total = [], 0
        for param in params:
            offsets.append(total)
            total += param.numel()
        dtype = params[0].dtype
        if self.compression and dtype.is_floating_point:
            dtype = torch.bfloat16 if self.compression == "bf16" else torch.float16
        index = len(self.buckets)
        buffer = torch.zeros(total, dtype=dtype, device=params[0].device)
        views = [
            buffer[offset : offset + p.numel()].view(p.shape) for p, offset in zip(params, offsets)
        ]
        self.buckets.append(_Bucket(params, offsets, buffer, views, group=self._groups))
        for slot, param in enumerate(params):
            self._where[id(param)] = (index, slot)
            param.register_post_accumulate_grad_hook(self._on_grad)

    def fingerprint(self) -> torch.Tensor:
        """`(buckets, 2)` float64: the sum and norm (reduced in the parameters' own precision:
        a float64 sum of float32 values costs ~10x more) of each bucket's parameters, for the
        replica check (Note [Replica check]). Between backward passes a bucket's buffer is
        free, so the parameters are copied into it with one multi-tensor copy and reduced in
        two ops per bucket, not two per parameter (a compressed buffer is too coarse: those
        buckets are concatenated instead)."""
        rows = []
        with torch.no_grad():
            for bucket in self.buckets:
                values = [p.detach() for p in bucket.params]
                if bucket.buffer.dtype == values[0].dtype:
                    foreach.copy_(bucket.views, values)
                    flat = bucket.buffer
                else:
                    flat = torch.cat([v.reshape(-1) for v in values])
                rows.append(torch.stack([flat.sum(), torch.linalg.vector_norm(flat)]).double())
        if not rows:
            return torch.zeros(0, 2, dtype=torch.float64)
        return torch.stack(rows).cpu()

    def layout(self) -> list[torch.Tensor]:
        """One empty tensor per bucket, shaped like its buffer (for a cross-rank check)."""
        return [torch.empty(b.buffer.numel(), dtype=b.buffer.dtype) for b in self.buckets]

    # -- during backward ------------------------------------------------------------------
    @eager_between_graphs
    def _on_grad(self, param: torch.Tensor) -> None:
        if not self._pending:
            self._pending = True
            self._start = time.perf_counter()
            queue_backward_callback(self._finish)
        index, _ = self._where[id(param)]
        bucket = self.buckets[index]
        self._touched.add(bucket.group)
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch_ready()

    def _launch_ready(self, final: bool = False) -> None:
        """Launch complete buckets in index order; at the end of backward (`final`), complete
        the buckets of every group this backward touched and skip the other groups' buckets
        (another model trained by a separate backward keeps its gradients as they are)."""
        while self._launched < len(self.buckets):
            bucket = self.buckets[self._launched]
            if bucket.ready < len(bucket.params):
                if not final:
                    return
                if bucket.group not in self._touched:
                    self._launched += 1
                    continue
                bucket.ready = len(bucket.params)
            self._launch(bucket)
            self._launched += 1

    def _launch(self, bucket: _Bucket) -> None:
        grads = [p.grad for p in bucket.params]
        with torch.no_grad():
            for grad in grads:  # a loop, not `all(...)`: no generator frame per gradient
                if grad is None:
                    for view, each in zip(bucket.views, grads):
                        view.zero_() if each is None else view.copy_(each)
                    break
            else:
                foreach.copy_(bucket.views, grads)
        bucket.work = self.group.all_reduce_async(bucket.buffer)

    @eager_between_graphs
    def _finish(self) -> None:
        self._pending = False
        try:
            self._launch_ready(final=True)
            nbytes = 0
            scale = 1.0 / self.group.world_size
            with torch.no_grad():
                for bucket in self.buckets:
                    if bucket.work is None:
                        continue
                    self.group.wait(bucket.work, "gradient all_reduce")
                    nbytes += bucket.buffer.numel() * bucket.buffer.element_size()
                    missing = [p for p in bucket.params if p.grad is None]
                    for param in missing:
                        param.grad = torch.zeros_like(param)
                    grads = [p.grad for p in bucket.params]
                    if bucket.buffer.dtype == bucket.params[0].dtype:
                        # One op on the contiguous buffer, not one per gradient (on a CPU
                        # `_foreach_mul_` is a loop of small ops: ~2 us per parameter).
                        bucket.buffer.mul_(scale)
                        foreach.copy_(grads, bucket.views)
                    else:  # compressed: cast back to the gradients' precision, then scale
                        foreach.copy_(grads, bucket.views)
                        foreach.mul_(grads, scale)
            self.group.record("gradient_sync", nbytes, self._start)
        finally:
            for bucket in self.buckets:
                bucket.ready, bucket.work = 0, None
            self._launched = 0
            self._touched.clear()
