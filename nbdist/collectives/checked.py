"""The checked collectives other than all-reduce, and the signature check every checked
collective starts with (Note [Checked collectives] in `nbdist.collectives.torch_dist`): one
fixed-size row per rank (signature, then an inline payload), all-gathered, so that ranks that
disagree about what they call still meet in a collective gloo can complete, and all raise the
same error. Part of `DistGroup` (a mixin over `GroupLifecycle`'s state); every collective
runs through the group's `Bookkeeping`.

Example (on every rank of a `DistGroup`)::

    group.all_gather(torch.ones(2, 3), axis=0)   # (2 * world_size, 3)
    group.broadcast_([weight], src=0)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from nbdist.collectives.bookkeeping import shape_of
from nbdist.collectives.signatures import DIMS as _DIMS
from nbdist.collectives.signatures import SIGNATURE_WIDTH as _SIGNATURE_WIDTH
from nbdist.collectives.signatures import describe as _describe
from nbdist.collectives.signatures import rows_agree as _rows_agree
from nbdist.collectives.signatures import signature as _signature
from nbdist.errors import CollectiveMismatchError

__all__ = ["INLINE_BYTES", "ROW_WIDTH", "CheckedCollectives", "all_gather_flat"]

INLINE_BYTES = 16 * 1024
"""All-reduces up to this size travel inside the signature check's row."""
ROW_WIDTH = _SIGNATURE_WIDTH + INLINE_BYTES // 8  # int64 words: signature, then inline payload


class CheckedCollectives:
    """Signature checks, all-gather, broadcast and barrier of `DistGroup`; not used alone."""

    # Set by GroupLifecycle (the group's state these methods use).
    rank: int
    world_size: int
    device: torch.device
    timeout: float
    _books: Any
    _layouts: Any

    def check(
        self,
        what: str,
        tensors: Sequence[torch.Tensor],
        *,
        timeout: float | None = None,
        layout: tuple | None = None,
    ):
        """Verify every rank calls `what` with the same shapes and dtypes (one small gather).

        `layout`: the all-reduce layout this check agrees on (Note [Agreed layouts]); None
        for other collectives. Returns every rank's signature rows.
        """
        rows = self._exchange_rows(
            f"{what} (signature check)", _signature(what, tensors), timeout,
            meta=shape_of(tensors),
        )  # fmt: skip
        rows = rows[:, :_SIGNATURE_WIDTH]
        if _rows_agree(rows):
            self._layouts.agreed(layout)
        else:
            self._layouts.broken()
            descriptions = "; ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(rows))
            raise CollectiveMismatchError(
                f"Workers called collectives that do not match ({descriptions}). Every worker "
                "must call the same collective with tensors of the same shapes and dtypes "
                "(check the data each worker feeds, and that no collective runs under a "
                "rank-dependent `if`)."
            )
        return rows

    def check_gather(self, what: str, tensor: torch.Tensor, axis: int, timeout: float | None):
        """Like `check`, but lets shapes differ along `axis`; returns each rank's length."""
        shape = list(tensor.shape)
        probe = torch.empty([*shape[:axis], 0, *shape[axis + 1 :]], dtype=tensor.dtype)
        mine = _signature(what, [tensor])
        mine[2] = _signature(what, [probe])[2]  # the layout hash ignores the gathered axis
        column = 3 + 2 + axis if axis < _DIMS else _SIGNATURE_WIDTH - 1
        mine[column] = tensor.shape[axis]
        rows = self._exchange_rows(
            f"{what} (signature check)", mine, timeout, meta=shape_of([tensor])
        )
        rows = rows[:, :_SIGNATURE_WIDTH]
        keep = torch.ones(_SIGNATURE_WIDTH, dtype=torch.bool)
        keep[column] = False
        if not bool((rows[:, keep] == rows[0, keep]).all()):
            self._layouts.broken()
            descriptions = "; ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(rows))
            if bool((rows[:, 0] == rows[0, 0]).all()):
                raise CollectiveMismatchError(
                    f"Workers called {what} with values that differ in more than axis {axis} "
                    f"({descriptions}). Only the gathered axis may differ between workers."
                )
            raise CollectiveMismatchError(
                f"Workers called collectives that do not match ({descriptions}). Every worker "
                "must call the same collective, in the same order."
            )
        self._layouts.agreed(None)
        return [int(n) for n in rows[:, column]]

    def _exchange_rows(
        self,
        what: str,
        signature: torch.Tensor,
        timeout: float | None,
        payload: torch.Tensor | None = None,
        meta: tuple = (None, None, 0),
    ) -> torch.Tensor:
        """All-gather one fixed-size row (signature + inline payload) per rank.

        Every checked collective sends rows of the same size, whatever it carries, so ranks
        that disagree about what they call still meet in a collective gloo can complete.
        Peers that predicted an agreed all-reduce are met first (Note [Agreed layouts]).
        `meta`: `(shape, dtype, bytes)` of what the caller's tensors are, for the recorder.
        """
        predicted = self._layouts.take()
        if predicted is not None:
            self._decline(predicted, timeout)
        row = torch.zeros(ROW_WIDTH, dtype=torch.int64)
        row[:_SIGNATURE_WIDTH] = signature
        if payload is not None:
            row[_SIGNATURE_WIDTH:].view(torch.uint8)[: payload.numel()] = payload
        out = torch.empty(self.world_size * ROW_WIDTH, dtype=torch.int64, device=self.device)
        self._books.run(
            what,
            lambda async_op: all_gather_flat(out, row.to(self.device), async_op=async_op),
            timeout,
            self.timeout,
            meta,
        )
        return out.cpu().view(self.world_size, ROW_WIDTH)

    def all_gather(
        self, tensor: torch.Tensor, axis: int, *, timeout: float | None = None
    ) -> torch.Tensor:
        """Concatenate every rank's `tensor` along `axis`, in rank order (lengths may differ)."""
        lengths = self.check_gather(f"all_gather:{axis}", tensor, axis, timeout)
        start = time.perf_counter()
        longest = max(lengths)
        moved = tensor.to(self.device).movedim(axis, 0).contiguous()
        padded = torch.zeros((longest, *moved.shape[1:]), dtype=moved.dtype, device=self.device)
        padded[: moved.shape[0]] = moved
        out = torch.empty((self.world_size * longest, *moved.shape[1:]), dtype=moved.dtype,
                          device=self.device)  # fmt: skip
        self._books.run(
            f"all_gather:{axis}",
            lambda async_op: all_gather_flat(out, padded, async_op=async_op),
            timeout,
            self.timeout,
            (tuple(moved.shape), moved.dtype, padded.numel() * padded.element_size()),
        )
        pieces = [out[r * longest : r * longest + n] for r, n in enumerate(lengths)]
        self._books.record(f"all_gather:{axis}", padded.numel() * padded.element_size(), start)
        return torch.cat(pieces).movedim(0, axis)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Overwrite `tensors` on every rank with rank `src`'s values (one buffer per dtype)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        start = time.perf_counter()
        nbytes = 0
        for group in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in group])
            nbytes += flat.numel() * flat.element_size()
            self._books.run(
                "broadcast",
                lambda async_op, f=flat: dist.broadcast(f, src, async_op=async_op),
                None,
                self.timeout,
                (tuple(flat.shape), flat.dtype, flat.numel() * flat.element_size()),
            )
            offset = 0
            with torch.no_grad():
                for t in group:
                    t.copy_(flat[offset : offset + t.numel()].view(t.shape))
                    offset += t.numel()
        self._books.record("broadcast", nbytes, start)

    def barrier(self, *, timeout: float | None = None) -> None:
        """Wait until every rank arrives."""
        token = torch.zeros(1, device=self.device)
        self._books.run(
            "barrier",
            lambda async_op: dist.all_reduce(token, async_op=async_op),
            timeout,
            self.timeout,
            ((1,), token.dtype, 4),
        )

    def record(self, op: str, nbytes: int, start: float) -> None:
        """Record a collective run by someone else (gradient buckets)."""
        self._books.record(op, nbytes, start)


def all_gather_flat(output: torch.Tensor, local: torch.Tensor, async_op: bool = False) -> Any:
    """Every rank's `local` into `output`, in rank order (torch's flat all-gather)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, local, async_op=async_op)
