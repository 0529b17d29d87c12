"""How nbdist starts an all-reduce on the process group itself (Note [Direct all-reduce]) and
what the hot path of an agreed layout keeps ready (Note [Prepared layouts]). Imports torch,
nbdist.core.reduce.op and nbdist.collectives.agreed only.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from nbdist.collectives import agreed
from nbdist.core.reduce.op import ReduceOp

__all__ = [
    "DIST_OPS",
    "MAX_BUFFER_BYTES",
    "MAX_PREPARED",
    "GatherBuffers",
    "Prepared",
    "allreduce_options",
    "prepare",
    "start_all_reduce",
]

# nbdist's reduce ops as torch.distributed's (MEAN is a SUM divided afterwards).
DIST_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MEAN: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
}

MAX_PREPARED = 1024  # layouts kept prepared (all forgotten past it, rebuilt on use)
MAX_BUFFER_BYTES = 4 * 1024 * 1024  # gather buffers kept, all layouts together (same rule)


# Note [Gather buffers]: a gathered hot path (Note [Small agreed all-reduces gather]) needs a
# send buffer (the data, then the trailer), the rows every rank's buffer lands in, each rank's
# data within them and the trailers' memoryview. Made per call, they cost four torch ops
# before the collective (`torch.cat`, `torch.empty`, two slices, `.numpy()`), each slow when
# the code is cold, as it is on a call timed after a barrier; and the peer, which waits for
# this rank's launch, waits for them too. So each gathered layout keeps them, made once: a
# call copies its tensor into the send buffer (one op, the trailer stays in place) and
# combines the rows into a new tensor after the wait (the result never shares the buffers).
# Measured: benchmarks/results/recorded/gather-buffers.json. Safe because
# (1) one call at a time uses them: `free` is taken without blocking, and a call that finds it
# taken (another thread inside) makes its own; (2) a collective that fails drops its layout's
# buffers (gloo could still write them), as does a group that is released or formed again;
# (3) they are made outside inference mode, so a first call inside `torch.inference_mode()`
# does not leave buffers a later call outside it may not write; (4) all layouts' buffers
# together stay under `MAX_BUFFER_BYTES` (past it every prepared layout is forgotten); (5)
# only on the CPU: on a GPU (gloo with CUDA tensors) a call on another stream could write the
# buffers while the last call's combine still reads them, so a gathered layout there takes
# `all_reduce`'s agreed path, which makes its own (the same collective on every rank).
class GatherBuffers:
    """The tensors one gathered layout's hot path reuses (Note [Gather buffers]).

    Example:
        >>> p = agreed.plan(agreed.layout_key(ReduceOp.SUM, [torch.zeros(2, 2)]),
        ...                 torch.device("cpu"))
        >>> b = GatherBuffers(p, torch.Size([2, 2]), 2, torch.device("cpu"), readable=True)
        >>> b.data.shape, b.rows.numel(), b.parts[1].shape, len(b.trailers)
        (torch.Size([2, 2]), 10, torch.Size([2, 2]), 2)
    """

    __slots__ = ("data", "free", "nbytes", "parts", "rows", "send", "trailers")

    def __init__(
        self,
        plan: agreed.Plan,
        shape: torch.Size,
        world_size: int,
        device: torch.device,
        *,
        readable: bool,
    ):
        n = plan.numel
        width = n + 1
        with torch.inference_mode(False):
            self.send = torch.cat((torch.empty(n, dtype=plan.trailer.dtype, device=device),
                                   plan.trailer))  # fmt: skip
            self.rows = torch.empty(world_size * width, dtype=self.send.dtype, device=device)
        self.data = self.send[:n].view(shape)
        """Where a call copies its tensor (the layout's shape)."""
        self.parts = [self.rows[r * width : r * width + n].view(shape) for r in range(world_size)]
        """Each rank's data within `rows`, in rank order (the layout's shape)."""
        self.trailers: Any = (
            memoryview(self.rows.numpy())[n::width] if readable else self.rows[n::width]
        )
        """Every rank's trailer (Note [Trailers after the wait])."""
        self.free = threading.Lock()
        """Held by the call using the buffers."""
        self.nbytes = (world_size + 1) * width * plan.itemsize


class Prepared(NamedTuple):
    """What `DistGroup.all_reduce_tensor`'s hot path compares and uses for one agreed layout."""

    plan: agreed.Plan
    op: ReduceOp
    dtype: torch.dtype
    shape: torch.Size
    options: Any  # the process group's all-reduce options for `op`, synchronous
    buffers: GatherBuffers | None  # where it runs as an all-gather (Note [Gather buffers])


# Note [Prepared layouts]: a user's small collective is timed call by call right after a
# barrier, when every piece of code and data the path touches is cold (Note [Calls per
# collective]). So `all_reduce_tensor` keeps, per agreed layout, everything it needs ready:
# the plan, the op, the dtype (compared by identity: dtypes are singletons), the shape, the
# process group's options; on a CPU group the tensor's device is checked with `is_cpu`, not by
# building a `torch.device`; and the hot path calls the process group itself, as `start_all_reduce`
# would for a plain tensor of a real dtype (which the checks guarantee). Measured against the
# same path reading `agreed.plan`'s cache: benchmarks/results/recorded/prepared-layouts.json.


def prepare(
    key: tuple, device: torch.device, world_size: int = 1, backend: str = "gloo"
) -> Prepared | None:
    """The hot path's constants for agreed layout `key` on `device`, in a group of
    `world_size` ranks on `backend`; None when the layout cannot take the hot path (several
    tensors, complex numbers, an all-gather off the CPU: Note [Gather buffers]).

    Example:
        >>> p = prepare(agreed.layout_key(ReduceOp.SUM, [torch.zeros(3)]), torch.device("cpu"))
        >>> p.shape, p.dtype, p.buffers.rows.numel()
        (torch.Size([3]), torch.float32, 4)
    """
    op, dtype, shapes = key
    if len(shapes) != 1 or dtype.is_complex:
        return None
    plan = agreed.plan(key, device)
    buffers = None
    if agreed.gathers(plan, world_size, backend):
        if device.type != "cpu":
            return None
        readable = dtype in _MEMORYVIEW_DTYPES
        buffers = GatherBuffers(plan, shapes[0], world_size, device, readable=readable)
    return Prepared(plan, op, dtype, shapes[0], allreduce_options(op, False), buffers)


# Note [Trailers after the wait]: the first torch op after a collective's wait is slow (the
# main thread wakes with torch's dispatch code and data cold), and raw
# `dist.all_reduce(t.clone())` runs none. So the gathered hot path keeps a memoryview of the
# rows' trailers (made with its buffers, Note [Gather buffers]) and reads them after the
# collective in pure Python (measured: benchmarks/results/recorded/trailers-after-the-wait.json).
# A memoryview indexes only these dtypes (not float16, bfloat16 or bool): others read with
# `.tolist()`.
_MEMORYVIEW_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
)


# Note [Direct all-reduce]: `dist.all_reduce` is a Python wrapper (a logging decorator, the
# torch-function check, group lookups, new options every call) around the process group's own
# `allreduce`, and costs a small all-reduce a measurable share of its time
# (benchmarks/results/recorded/direct-all-reduce.json). Every all-reduce nbdist runs goes
# through `start_all_reduce`
# (except the hot path of a prepared layout, Note [Prepared layouts]),
# which calls `ProcessGroup.allreduce` on the default group with options built once per op,
# and waits as `dist.all_reduce` does. It takes this path only where the wrapper does nothing
# else: a plain, non-complex tensor (the wrapper views complex tensors as real pairs and hands
# tensor subclasses to their `__torch_function__`).
@functools.lru_cache(maxsize=16)
def allreduce_options(op: ReduceOp, async_op: bool) -> dist.AllreduceOptions:
    """The process group's all-reduce options for `op` (cached: read only)."""
    options = dist.AllreduceOptions()
    options.reduceOp = DIST_OPS[op]
    options.asyncOp = async_op
    return options


def start_all_reduce(flat: torch.Tensor, op: ReduceOp, *, async_op: bool, world: Any = None) -> Any:
    """All-reduce `flat` in place, as `dist.all_reduce(flat, op, async_op=async_op)` does, on
    the process group itself where the wrapper would do nothing more (Note [Direct all-reduce]).
    `world`: the default process group when the caller holds it (else looked up).
    Returns the work when `async_op` (None or a finished work otherwise)."""
    if type(flat) is not torch.Tensor or flat.is_complex():
        return dist.all_reduce(flat, DIST_OPS[op], async_op=async_op)
    if world is None:
        world = dist.group.WORLD
    work = world.allreduce([flat], allreduce_options(op, async_op))
    if not async_op and work is not None:
        work.wait()
    return work
