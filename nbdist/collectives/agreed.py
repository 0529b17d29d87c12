"""Agreed layouts: a checked all-reduce whose layout every rank already agreed on costs one
collective, with no separate signature exchange.

Note [Agreed layouts]: a checked collective first exchanges a fixed-size signature row
(Note [Checked collectives] in `torch_dist`), which doubles the latency of a small all-reduce
and costs a round trip at every size. But the signature of a training step's collectives
repeats. Once every rank has passed the check for layout `K` (op, dtype, shapes), every rank
records it, and records which layout came after the one before it (`A -> B`). Those records are
identical on every rank, because they change only after a collective every rank completed with
the same result. The next checked all-reduce then *predicts* the layout that followed last time,
and every rank runs one all-reduce of the predicted size with one extra trailing element:

- a rank whose call has the predicted layout sends its data and the trailer "ok";
- a rank whose call differs (another shape, op or dtype, or another collective altogether)
  sends zeros of the predicted size and the trailer "changed".

Gloo never sees buffers of different sizes (every rank sends the predicted size), and the
reduced trailer tells every rank the same thing: all "ok", and the result is the all-reduce;
any "changed", and every rank drops the prediction and runs the full check, which then names the
mismatch on every rank. So the check stays exact; only its cost moves to the (rare) call whose
layout differs from last time.

Note [Small agreed all-reduces gather]: on gloo, a small agreed all-reduce is run as one
all-gather of every rank's buffer (data and trailer), and each rank combines the rows itself,
in rank order (so every rank gets the same bits). Gloo's ring all-reduce takes 2(n-1) message
steps, its all-gather n-1, and a small collective's time is its steps. Every rank sees every
trailer: all "ok", and the combined rows are the result; any "changed", and every rank runs
the full check, as above. Whether a layout gathers depends only on the layout, the group's
size and its backend, so every rank (the hot path, the other agreed path and a rank that
declines) runs the same collective. Used only while the gathered rows fit `GATHER_BYTES`
(past it the all-reduce's fewer bytes win over its extra steps). The measurements behind
`GATHER_BYTES`: benchmarks/results/recorded/small-agreed-all-reduces-gather.json
(`benchmarks/bench_user_collective.py`).
Imports only torch and nbdist.core.reduce.op.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from nbdist.core.reduce.op import ReduceOp

__all__ = [
    "GATHER_BYTES",
    "AgreedLayouts",
    "Plan",
    "fill",
    "flags",
    "gathers",
    "layout_key",
    "numel",
    "plan",
    "split",
    "trailer",
]

_MAX_REMEMBERED = 1024

GATHER_BYTES = 32 * 1024
"""The most bytes of gathered rows (all ranks together) a gathered agreed all-reduce moves
(Note [Small agreed all-reduces gather])."""


def gathers(plan: Plan, world_size: int, backend: str) -> bool:
    """Whether the agreed all-reduce of `plan` runs as an all-gather (Note [Small agreed
    all-reduces gather]): on gloo, while every rank's buffer together fits `GATHER_BYTES`.
    The same answer on every rank of a group.

    Example:
        >>> p = plan(layout_key(ReduceOp.SUM, [torch.zeros(1024)]), torch.device("cpu"))
        >>> gathers(p, 2, "gloo"), gathers(p, 16, "gloo"), gathers(p, 2, "nccl")
        (True, False, False)
    """
    return backend == "gloo" and (plan.numel + 1) * plan.itemsize * world_size <= GATHER_BYTES


def layout_key(op: ReduceOp, tensors: Sequence[torch.Tensor]) -> tuple | None:
    """What two ranks' all-reduce calls must share to run as one collective; None when the
    call cannot take the agreed path (mixed dtypes, bool, nothing to reduce).

    Example:
        >>> layout_key(ReduceOp.SUM, [torch.zeros(2, 3)])
        (<ReduceOp.SUM: 'SUM'>, torch.float32, (torch.Size([2, 3]),))
    """
    if len(tensors) == 1:  # the common case, on every user collective: no generator
        tensor = tensors[0]
        dtype = tensor.dtype
        return None if dtype == torch.bool else (op, dtype, (tensor.shape,))
    if not tensors:
        return None
    dtype = tensors[0].dtype
    if dtype == torch.bool or any(t.dtype != dtype for t in tensors):
        return None
    return (op, dtype, tuple(t.shape for t in tensors))


class AgreedLayouts:
    """The layouts every rank agreed on, and which one followed which (identical on all ranks).

    Example:
        >>> layouts = AgreedLayouts()
        >>> a = layout_key(ReduceOp.SUM, [torch.zeros(2)])
        >>> b = layout_key(ReduceOp.MAX, [torch.zeros(3)])
        >>> for key in (a, b, a):
        ...     layouts.agreed(key)
        >>> layouts.take() == b, layouts.take()
        (True, None)
    """

    def __init__(self) -> None:
        self._previous: tuple | None = None
        self._next: dict[tuple | None, tuple] = {}
        self._taken = False

    def predicted(self) -> tuple | None:
        """The layout that followed the previous one last time (None: no prediction)."""
        if self._previous is None:
            return None
        return self._next.get(self._previous)

    def take(self) -> tuple | None:
        """The prediction for the collective starting now, once: asked again before the
        collective is agreed or broken, it is None (the prediction was already resolved)."""
        if self._taken:
            return None
        self._taken = True
        previous = self._previous
        return None if previous is None else self._next.get(previous)

    def agreed(self, key: tuple | None) -> None:
        """Every rank completed a checked all-reduce of layout `key` (None: another kind of
        checked collective, which breaks the chain)."""
        self._taken = False
        previous = self._previous
        if previous is not None and key is not None:
            if len(self._next) >= _MAX_REMEMBERED and previous not in self._next:
                self._next.clear()
            self._next[previous] = key
        self._previous = key

    def broken(self) -> None:
        """A checked collective failed or found a mismatch: start a new chain (every rank)."""
        self._taken = False
        self._previous = None

    def forget(self) -> None:
        """Forget everything (the group was formed again, or failed)."""
        self._taken = False
        self._previous = None
        self._next.clear()


def numel(key: tuple) -> int:
    """Elements of every tensor of layout `key` together."""
    total = 0
    for shape in key[2]:
        total += shape.numel()
    return total


def flags(op: ReduceOp) -> tuple[int, int]:
    """(ok, changed) trailer values for `op`: reduced over ranks, the result is `ok` only when
    every rank sent `ok` (SUM and MAX: 0 and 1; MIN: 1 and 0)."""
    return (1, 0) if op is ReduceOp.MIN else (0, 1)


_TRAILERS: dict[tuple, torch.Tensor] = {}


def trailer(dtype: torch.dtype, value: int, device: torch.device) -> torch.Tensor:
    """A one-element tensor holding `value` (cached: read only, never written)."""
    key = (dtype, value, device)
    found = _TRAILERS.get(key)
    if found is None:
        found = _TRAILERS[key] = torch.full((1,), value, dtype=dtype, device=device)
    return found


class Plan(NamedTuple):
    """What an agreed all-reduce of one layout needs, worked out once per layout (`plan`)."""

    numel: int
    """Elements of the layout's tensors together (the trailer sits at this index)."""
    ok: int
    """The trailer value that means "every rank called this layout" (`flags`)."""
    trailer: torch.Tensor
    """A one-element tensor holding `ok` on the group's device (read only)."""
    nbytes: int
    """Bytes of the layout's data (what telemetry records)."""
    shape: torch.Size | None
    """The one tensor's shape when the layout has one tensor that is not 1-d, else None."""
    what: str
    """The collective's name in telemetry and errors (`"all_reduce:SUM"`)."""
    itemsize: int
    """Bytes per element of the layout's dtype."""


@functools.lru_cache(maxsize=_MAX_REMEMBERED)
def plan(key: tuple, device: torch.device) -> Plan:
    """The `Plan` of layout `key` on `device` (cached: the hot path of every agreed call).

    Example:
        >>> p = plan(layout_key(ReduceOp.SUM, [torch.zeros(2, 3)]), torch.device("cpu"))
        >>> p.numel, p.ok, p.nbytes, p.shape
        (6, 0, 24, torch.Size([2, 3]))
    """
    op, dtype, shapes = key
    n = numel(key)
    ok = flags(op)[0]
    single = shapes[0] if len(shapes) == 1 and len(shapes[0]) != 1 else None
    itemsize = torch.empty((), dtype=dtype).element_size()
    what = f"all_reduce:{op.value}"
    return Plan(n, ok, trailer(dtype, ok, device), n * itemsize, single, what, itemsize)


def fill(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy `tensors` one after the other into the front of `flat`."""
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        flat[offset : offset + n].copy_(tensor.detach().reshape(-1))
        offset += n


def split(flat: torch.Tensor, key: tuple) -> list[Any]:
    """Views of `flat` shaped as layout `key`'s tensors."""
    out = []
    offset = 0
    for shape in key[2]:
        n = shape.numel()
        out.append(flat[offset : offset + n].view(shape))
        offset += n
    return out
