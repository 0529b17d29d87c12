"""How nbdist starts an all-reduce on the process group itself (Note [Direct all-reduce]) and
what the hot path of an agreed layout keeps ready (Note [Prepared layouts]). Imports torch,
nbdist.reduce and nbdist.collectives.agreed only.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from nbdist.collectives import agreed
from nbdist.reduce import ReduceOp

__all__ = [
    "DIST_OPS",
    "MAX_PREPARED",
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


class Prepared(NamedTuple):
    """What `DistGroup.all_reduce_tensor`'s hot path compares and uses for one agreed layout."""

    plan: agreed.Plan
    op: ReduceOp
    dtype: torch.dtype
    shape: torch.Size
    options: Any  # the process group's all-reduce options for `op`, synchronous
    gathered: bool  # run as an all-gather (Note [Small agreed all-reduces gather])
    readable: bool  # its trailers are read through a memoryview (Note [Trailers after the wait])


# Note [Prepared layouts]: a user's small collective is timed call by call right after a
# barrier, when every piece of code and data the path touches is cold (Note [Calls per
# collective]). So `all_reduce_tensor` keeps, per agreed layout, everything it needs ready:
# the plan, the op, the dtype (compared by identity: dtypes are singletons), the shape, the
# process group's options; on a CPU group the tensor's device is checked with `is_cpu`, not by
# building a `torch.device`; and the hot path calls the process group itself, as `start_all_reduce`
# would for a plain tensor of a real dtype (which the checks guarantee). Against the same path
# reading `agreed.plan`'s cache and calling `start_all_reduce`, 14-50 us less per 4 KiB call
# (gloo, 2 vCPUs, 4 launches).


def prepare(
    key: tuple, device: torch.device, world_size: int = 1, backend: str = "gloo"
) -> Prepared | None:
    """The hot path's constants for agreed layout `key` on `device`, in a group of
    `world_size` ranks on `backend`; None when the layout cannot take the hot path (several
    tensors, complex numbers).

    Example:
        >>> p = prepare(agreed.layout_key(ReduceOp.SUM, [torch.zeros(3)]), torch.device("cpu"))
        >>> p.shape, p.dtype, p.gathered, p.readable
        (torch.Size([3]), torch.float32, True, True)
    """
    op, dtype, shapes = key
    if len(shapes) != 1 or dtype.is_complex:
        return None
    plan = agreed.plan(key, device)
    gathered = agreed.gathers(plan, world_size, backend)
    readable = device.type == "cpu" and dtype in _MEMORYVIEW_DTYPES
    options = allreduce_options(op, False)
    return Prepared(plan, op, dtype, shapes[0], options, gathered, readable)


# Note [Trailers after the wait]: the first torch op after a collective's wait costs 10-15 us
# on a small machine (the main thread wakes with torch's dispatch code and data cold) against
# ~1 us warm, and raw `dist.all_reduce(t.clone())` runs none. So the gathered hot path makes
# a memoryview of the rows' trailers before the collective and reads them after it in pure
# Python: in-process A/B at 4 KiB over `strategy.run` (gloo, 2 workers on 2 vCPUs, 5
# launches of 400 calls), 8-27 us less per call (median paired difference; such an A/B
# flatters both sides alike, the two variants keeping each other's code warm). A memoryview
# indexes only these dtypes (not float16, bfloat16 or bool): others read with `.tolist()`.
_MEMORYVIEW_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
)


# Note [Direct all-reduce]: `dist.all_reduce` is a Python wrapper (a logging decorator, the
# torch-function check, group lookups, new options every call) around the process group's own
# `allreduce`; on a one-process gloo group a 4 KiB all-reduce takes ~55 us called directly and
# 70-80 us through the wrapper. Every all-reduce nbdist runs goes through `start_all_reduce`
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
