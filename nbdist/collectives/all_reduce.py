"""The all-reduce paths of `DistGroup`: which call takes which path, and each path.

Every path counts, times, records and diagnoses its collectives through the group's one
`Bookkeeping` (`nbdist.collectives.bookkeeping`): `#n` in an error, the dashboard's stuck view,
`%dist stack` and the collective recorder read the same numbers.

Which call takes which path ([n]: the collectives it runs, each numbered by the bookkeeping):

    call / condition                              path
    --------------------------------------------  ----------------------------------------------
    all_reduce_tensor(t, op)                      hot path, in one frame: the process group's
      t has the layout every rank predicts, is a  own all-reduce of t and the trailer, or its
      plain tensor on the group's device; the     all-gather into kept buffers for a small
      group's timeout; no compression             gloo layout [1]
    all_reduce_tensor(t, op), anything else       all_reduce([t], op, prediction=...) below
    all_reduce(tensors, op)
      the layout is the predicted one             _all_reduce_agreed -> _exchange_agreed:
                                                  all-gather or _all_reduce_direct [1]
      another layout was predicted                _decline (meets the peers' prediction with
                                                  "changed") [1], then a row below
      checked, up to INLINE_BYTES, no bool        _all_reduce_inline: the data ride in the
                                                  signature row (_exchange_rows) [1]
      checked, larger                             check (signature row) [1], then one
                                                  all-reduce per dtype [1 each]
      check=False, or compression=                one all-reduce per dtype [1 each]
    all_reduce_async(flat) + wait(work)           Bookkeeping.start_async, finished by
      gradient buckets (checked at scope exit)    Bookkeeping.wait [1]

Note [Checked collectives] (in `nbdist.collectives.torch_dist`) says why every user-facing
collective is checked; Note [Agreed layouts] (`nbdist.collectives.agreed`) how the check
rides in one trailing element once all ranks agreed on a layout.

Example (on every rank of a `DistGroup`)::

    group.all_reduce_tensor(torch.ones(3), ReduceOp.SUM)          # the hot path from the 2nd call
    group.all_reduce([torch.ones(3), torch.ones(2, dtype=torch.int64)], ReduceOp.MAX)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from nbdist.collectives import agreed
from nbdist.collectives.bookkeeping import shape_of
from nbdist.collectives.checked import INLINE_BYTES, all_gather_flat
from nbdist.collectives.direct import (
    MAX_BUFFER_BYTES,
    MAX_PREPARED,
    Prepared,
    prepare,
    start_all_reduce,
)
from nbdist.collectives.signatures import SIGNATURE_WIDTH as _SIGNATURE_WIDTH
from nbdist.collectives.signatures import describe as _describe
from nbdist.collectives.signatures import rows_agree as _rows_agree
from nbdist.collectives.signatures import signature as _signature
from nbdist.core.reduce.op import ReduceOp, refuse_bool
from nbdist.errors import CollectiveMismatchError

__all__ = ["AllReducePaths"]

_TAKE = object()  # all_reduce's `prediction` default: take it from the agreed layouts


class AllReducePaths:
    """The all-reduces of `DistGroup` (see the module docstring's table); not used alone."""

    # Set by GroupLifecycle (the group's state these methods use).
    rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout: float
    _books: Any
    _layouts: Any
    _world: Any
    _prepared: dict
    _buffer_bytes: int
    _on_cpu: bool

    def all_reduce(
        self,
        tensors: Sequence[torch.Tensor],
        op: ReduceOp,
        *,
        timeout: float | None = None,
        compression: str | None = None,
        check: bool = True,
        prediction: Any = _TAKE,
    ) -> list[torch.Tensor]:
        """Reduce `tensors` across ranks; returns new tensors (one flat buffer per dtype).

        Small payloads (up to 16 KiB) travel inside the signature check itself: one fixed-size
        all_gather carries every rank's signature and data, and each rank combines the rows
        in rank order (so all ranks get the same bits). Larger ones are checked, then reduced.
        `prediction`: the agreed layout predicted for this call when the caller has already
        taken it (`all_reduce_tensor`).
        """
        key = agreed.layout_key(op, tensors) if check and compression is None else None
        if prediction is _TAKE:
            prediction = self._layouts.take() if check else None
        predicted = prediction
        if predicted is not None:
            if key == predicted:
                fast = self._all_reduce_agreed(tensors, key, timeout)
                if fast is not None:
                    return fast
            else:
                self._decline(predicted, timeout)
        nbytes_in = sum(-(-t.numel() * t.element_size() // 8) * 8 for t in tensors)
        if check and nbytes_in <= INLINE_BYTES and not any(t.dtype == torch.bool for t in tensors):
            results = self._all_reduce_inline(tensors, op, timeout)
            self._layouts.agreed(key)
            return results
        if check:
            self.check(f"all_reduce:{op.value}", tensors, timeout=timeout, layout=key)
        # After the check, so that every rank raises the same error (a rank whose dtype
        # differs gets the mismatch error instead). Note [Bool reductions]
        refuse_bool(op, tensors)
        start = time.perf_counter()
        results: list[Any] = [None] * len(tensors)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, tensor in enumerate(tensors):
            by_dtype.setdefault(tensor.dtype, []).append(i)
        nbytes = 0
        for dtype, indices in by_dtype.items():
            parts = [tensors[i].to(self.device) for i in indices]
            flat = (
                torch.cat([p.reshape(-1) for p in parts])
                if len(parts) > 1
                else (parts[0].reshape(-1).clone())
            )
            wire = _compress(flat, compression)
            nbytes += wire.numel() * wire.element_size()
            self._books.run(
                f"all_reduce:{op.value}",
                lambda async_op, w=wire: start_all_reduce(
                    w, op, async_op=async_op, world=self._world
                ),
                timeout,
                self.timeout,
                (tuple(wire.shape), wire.dtype, wire.numel() * wire.element_size()),
            )
            flat = wire.to(dtype) if wire.dtype != dtype else wire
            if op is ReduceOp.MEAN:
                flat = _mean(flat, self.world_size)
            offset = 0
            for i, part in zip(indices, parts):
                results[i] = flat[offset : offset + part.numel()].view(part.shape)
                offset += part.numel()
        self._books.record(f"all_reduce:{op.value}", nbytes, start)
        return results

    def all_reduce_tensor(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        *,
        timeout: float | None = None,
        compression: str | None = None,
    ) -> torch.Tensor:
        """`all_reduce([tensor], op)[0]`, checked: the hot path of every user collective.

        When the call has the layout every rank predicts (Note [Agreed layouts]) and nothing
        unusual (the group's device, a plain tensor, the group's timeout, no compression), the
        whole collective runs here in one frame: one copy with the trailer, the process group's
        own all-reduce (Note [Direct all-reduce]) or, for a small layout on gloo, its all-gather
        into the layout's kept buffers (Note [Gather buffers]) and the rows combined in rank
        order (Note [Small agreed all-reduces gather]), the trailer's read, telemetry. Anything
        else takes `all_reduce`, which handles every case.

        Example (on every rank): `group.all_reduce_tensor(torch.ones(3), ReduceOp.SUM)`.
        """
        layouts = self._layouts
        predicted = layouts.take()
        prepared = self._prepared.get(predicted) if predicted is not None else False
        if prepared is None:
            prepared = self._prepare(predicted)
        if (
            not prepared
            or compression is not None
            or (timeout is not None and timeout != self.timeout)
            or prepared.op is not op
            or tensor.dtype is not prepared.dtype
            or tensor.shape != prepared.shape
            or type(tensor) is not torch.Tensor
            or (not tensor.is_cpu if self._on_cpu else tensor.device != self.device)
            or self._books.broken is not None
        ):
            return self.all_reduce(
                [tensor], op, timeout=timeout, compression=compression, prediction=predicted
            )[0]
        start = time.perf_counter()
        plan = prepared.plan
        source = tensor.detach() if tensor.requires_grad else tensor
        buffers = prepared.buffers
        if buffers is not None:  # Note [Small agreed all-reduces gather]
            if not buffers.free.acquire(blocking=False):  # Note [Gather buffers]
                return self.all_reduce([tensor], op, timeout=timeout, prediction=predicted)[0]
            buffers.data.copy_(source)
            flat = buffers.send
        else:
            flat = torch.cat((source if source.dim() == 1 else source.reshape(-1), plan.trailer))
        what = plan.what
        books = self._books
        number = books.begin(what, prepared.shape, prepared.dtype, plan.nbytes, start)
        try:
            # The process group's own collectives, their conditions checked above (Note
            # [Prepared layouts]): a plain tensor of the layout's real dtype.
            if buffers is not None:
                self._world.all_gather_single(buffers.rows, flat).wait()
            else:
                self._world.allreduce([flat], prepared.options).wait()
        except BaseException as error:
            if buffers is not None:  # gloo may still write them: never used again
                self._prepared.pop(predicted, None)
            if isinstance(error, RuntimeError):
                raise books.diagnose(what, error) from error
            raise
        finally:
            books.end(number)
        if buffers is not None:
            try:
                changed = buffers.trailers.tolist().count(plan.ok) != self.world_size
                # In rank order (the same bits on every rank), into a new tensor.
                data = None if changed else op.combine(buffers.parts)
            finally:
                buffers.free.release()
        else:
            changed = flat[plan.numel].item() != plan.ok
            if not changed:
                data = flat[: plan.numel]
                if op is ReduceOp.MEAN:
                    data = _mean(data, self.world_size)
                if plan.shape is not None:
                    data = data.view(plan.shape)
        if changed:  # every rank saw "changed": each runs the full check
            return self.all_reduce([tensor], op, timeout=timeout, prediction=None)[0]
        layouts.agreed(predicted)
        telemetry = books.telemetry
        if telemetry is not None and telemetry.enabled:
            duration = time.perf_counter() - start
            telemetry.record(what, plan.nbytes, self.backend, books.ranks, start, duration,
                             (duration,))  # fmt: skip
        return data

    def _exchange_agreed(
        self, plan: agreed.Plan, flat: torch.Tensor, op: ReduceOp, timeout: float | None
    ) -> torch.Tensor | None:
        """Every rank's `flat` (layout `plan`'s data, then the trailer) combined by `op`:
        `plan.numel` elements, or None when any rank's trailer says "changed" (Note [Agreed
        layouts]). An all-gather where the layout gathers (Note [Small agreed all-reduces
        gather]), else an all-reduce in place; the same collective on every rank."""
        n = plan.numel
        if agreed.gathers(plan, self.world_size, self.backend):
            width = n + 1
            rows = torch.empty(self.world_size * width, dtype=flat.dtype, device=flat.device)
            self._books.run(
                plan.what,
                lambda async_op: all_gather_flat(rows, flat, async_op=async_op),
                timeout,
                self.timeout,
                _plan_meta(plan, flat),
            )
            table = rows.view(self.world_size, width)
            if table[:, n].tolist().count(plan.ok) != self.world_size:
                return None
            return op.combine(list(table[:, :n].unbind(0)))
        self._all_reduce_direct(plan.what, flat, op, timeout, _plan_meta(plan, flat))
        if flat[n].item() != plan.ok:
            return None
        data = flat[:n]
        return _mean(data, self.world_size) if op is ReduceOp.MEAN else data

    def _prepare(self, key: tuple) -> Prepared | bool:
        """`prepare(key)`, kept for the next calls; False when the layout cannot take the hot
        path (Note [Prepared layouts])."""
        prepared = (
            prepare(key, self.device, self.world_size, self.backend)
            if self._world is not None
            else None
        )
        nbytes = prepared.buffers.nbytes if prepared and prepared.buffers is not None else 0
        if len(self._prepared) >= MAX_PREPARED or self._buffer_bytes + nbytes > MAX_BUFFER_BYTES:
            self._prepared.clear()  # Note [Gather buffers]
            self._buffer_bytes = 0
        self._buffer_bytes += nbytes
        self._prepared[key] = prepared or False
        return prepared or False

    def _all_reduce_agreed(
        self, tensors: Sequence[torch.Tensor], key: tuple, timeout: float | None
    ) -> list[torch.Tensor] | None:
        """One all-reduce of the agreed layout `key` plus its trailer (Note [Agreed layouts]);
        None, on every rank alike, when another rank's call differs.

        The hot path of every user collective: the layout's constants come from `agreed.plan`,
        and one tensor on the group's device costs one copy (`torch.cat` with the trailer,
        which also gives the new tensor the result must be) and no other tensor op but the
        trailer's read and the result's view.
        """
        op = key[0]
        start = time.perf_counter()
        plan = agreed.plan(key, self.device)
        n = plan.numel
        single = len(tensors) == 1 and tensors[0].device == self.device
        if single:
            source = tensors[0]
            if source.requires_grad:
                source = source.detach()
            if source.dim() != 1:
                source = source.reshape(-1)
            flat = torch.cat((source, plan.trailer))
        else:
            flat = torch.empty(n + 1, dtype=key[1], device=self.device)
            agreed.fill(flat, tensors)
            flat[n] = plan.ok
        data = self._exchange_agreed(plan, flat, op, timeout)
        if data is None:
            return None  # every rank saw "changed": each now runs the full check
        if single:
            results = [data if plan.shape is None else data.view(plan.shape)]
        elif len(tensors) == 1:
            result = data if plan.shape is None else data.view(plan.shape)
            results = [result.to(tensors[0].device)]
        else:
            results = [r.to(t.device) for r, t in zip(agreed.split(data, key), tensors)]
        self._layouts.agreed(key)
        self._books.record(plan.what, plan.nbytes, start)
        return results

    def _all_reduce_direct(
        self, what: str, flat: torch.Tensor, op: ReduceOp, timeout: float | None, meta: tuple
    ) -> None:
        """All-reduce `flat` in place through the process group itself (Note [Direct
        all-reduce]), with the group's bookkeeping."""
        self._books.run(
            what,
            lambda async_op: start_all_reduce(flat, op, async_op=async_op, world=self._world),
            timeout,
            self.timeout,
            meta,
        )

    def _decline(self, predicted: tuple, timeout: float | None) -> None:
        """Meet peers that expect an all-reduce of layout `predicted` with zeros and the
        trailer "changed" (this call differs), so that every rank runs the full check next."""
        op, dtype, _ = predicted
        flat = torch.zeros(agreed.numel(predicted) + 1, dtype=dtype, device=self.device)
        flat[-1] = agreed.flags(op)[1]
        self._exchange_agreed(agreed.plan(predicted, self.device), flat, op, timeout)

    def _all_reduce_inline(
        self, tensors: Sequence[torch.Tensor], op: ReduceOp, timeout: float | None
    ) -> list[torch.Tensor]:
        what = f"all_reduce:{op.value}"
        start = time.perf_counter()
        payload = torch.zeros(INLINE_BYTES, dtype=torch.uint8)
        offsets = []
        offset = 0
        for tensor in tensors:
            raw = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
            offsets.append(offset)
            payload[offset : offset + raw.numel()] = raw
            offset += -(-raw.numel() // 8) * 8  # keep every tensor 8-byte aligned
        full = self._exchange_rows(
            what, _signature(what, tensors), timeout, payload, meta=shape_of(tensors)
        )
        rows = full
        signatures = rows[:, :_SIGNATURE_WIDTH]
        if not _rows_agree(signatures):
            self._layouts.broken()
            descriptions = "; ".join(
                f"rank {r}: {_describe(sig)}" for r, sig in enumerate(signatures)
            )
            raise CollectiveMismatchError(
                f"Workers called collectives that do not match ({descriptions}). Every worker "
                "must call the same collective with tensors of the same shapes and dtypes "
                "(check the data each worker feeds, and that no collective runs under a "
                "rank-dependent `if`)."
            )
        results = []
        for tensor, offset in zip(tensors, offsets):
            size = tensor.numel() * tensor.element_size()
            parts = [
                rows[r, _SIGNATURE_WIDTH:].contiguous().view(torch.uint8)[offset : offset + size]
                .view(tensor.dtype).view(tensor.shape)
                for r in range(self.world_size)
            ]  # fmt: skip
            results.append(op.combine(parts).to(tensor.device))
        self._books.record(what, sum(t.numel() * t.element_size() for t in tensors), start)
        return results

    def all_reduce_async(self, flat: torch.Tensor) -> Any:
        """Start a SUM all-reduce of `flat` in place (gradient buckets); returns its work."""
        return self._books.start_async(
            "gradient all_reduce",
            lambda: start_all_reduce(flat, ReduceOp.SUM, async_op=True, world=self._world),
            (tuple(flat.shape), flat.dtype, flat.numel() * flat.element_size()),
        )

    def wait(self, work: Any, what: str) -> None:
        """Wait for an asynchronous collective, naming the missing ranks if it fails."""
        self._books.wait(work, what)


def _plan_meta(plan: agreed.Plan, flat: torch.Tensor) -> tuple:
    """The recorder's `(shape, dtype, bytes)` of an agreed layout's collective."""
    return (plan.shape if plan.shape is not None else (plan.numel,), flat.dtype, plan.nbytes)


def _compress(flat: torch.Tensor, compression: str | None) -> torch.Tensor:
    if compression is None or not flat.is_floating_point():
        return flat
    target = torch.bfloat16 if compression == "bf16" else torch.float16
    return flat if flat.dtype == target else flat.to(target)


def _mean(flat: torch.Tensor, count: int) -> torch.Tensor:
    if not (flat.is_floating_point() or flat.is_complex()):
        flat = flat.to(torch.get_default_dtype())
    return flat.div_(count)
