"""Collectives between processes on `torch.distributed` (gloo or NCCL): with
`nbdist.collectives.direct` (how an all-reduce is started), the only module that calls
torch.distributed collectives.

Note [Checked collectives]: gloo aborts the process when ranks pass buffers of different sizes
and silently mixes dtypes of the same width, so every user-facing collective first exchanges a
fixed-size signature (op, shapes, dtypes) with one small `all_gather`; every rank then sees every
signature and all raise the same clear error. An all-reduce whose layout all ranks already
agreed on skips that exchange and carries the check in one trailing element (Note [Agreed
layouts] in `nbdist.collectives.agreed`). Gradient buckets skip the check: their layout is
checked once, when the model's scope exits.

Note [Naming the missing rank] and Note [Raw collectives]: see `nbdist.collectives.liveness`.

Note [A store on one address]: see `nbdist.collectives.store`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nbdist.collectives import agreed
from nbdist.collectives.abort import ABORT_KEY, GroupSockets, decode_abort, encode_abort
from nbdist.collectives.direct import (
    MAX_BUFFER_BYTES,
    MAX_PREPARED,
    Prepared,
    prepare,
    start_all_reduce,
)
from nbdist.collectives.gpu_sharing import UNKNOWN as UNKNOWN_GPU
from nbdist.collectives.gpu_sharing import check_one_gpu_each, gpu_identity
from nbdist.collectives.liveness import C10D_FILE, Liveness
from nbdist.collectives.signatures import DIMS as _DIMS
from nbdist.collectives.signatures import SIGNATURE_WIDTH as _SIGNATURE_WIDTH
from nbdist.collectives.signatures import describe as _describe
from nbdist.collectives.signatures import rows_agree as _rows_agree
from nbdist.collectives.signatures import signature as _signature
from nbdist.collectives.store import BIND_STORE_ENV, connect_store
from nbdist.errors import (
    CollectiveMismatchError,
    RendezvousError,
    WorkerLostError,
)
from nbdist.reduce import ReduceOp, refuse_bool
from nbdist.telemetry import Telemetry

__all__ = ["BIND_STORE_ENV", "DistGroup", "raised_in_torch_distributed"]


_INLINE_BYTES = 16 * 1024
_TAKE = object()  # all_reduce's `prediction` default: take it from the agreed layouts
_ROW_WIDTH = _SIGNATURE_WIDTH + _INLINE_BYTES // 8  # int64 words: signature, then inline payload


class DistGroup:
    """The process group of a multi-worker strategy, with checked, timed, recorded collectives.

    Context: every method is a collective: every rank must call it, in the same order.
    Hangs if: never; a rank that dies, fails or never arrives is named in a `WorkerLostError` or
    `CollectiveTimeoutError` on every surviving rank within the timeout.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        backend: str,
        device: torch.device,
        timeout: float,
        telemetry: Telemetry | None = None,
        prefix: str = "nbdist",
    ):
        self.rank = rank
        self._ranks = (rank,)  # the replicas of this process's telemetry records
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self.telemetry = telemetry
        self._entered = 0
        self._async_numbers: dict[int, int] = {}  # id(work) -> its collective number
        self._layouts = agreed.AgreedLayouts()  # Note [Agreed layouts]
        # The default group, read once per group formed (`dist.group.WORLD` is a property over
        # a lookup, two Python calls per collective: Note [Calls per collective]); None once
        # released (`_release_world`).
        self._world: Any = None
        # The hot path's constants per agreed layout (Note [Prepared layouts]).
        self._prepared: dict[tuple, Prepared | bool] = {}
        self._buffer_bytes = 0  # of the prepared layouts' gather buffers (Note [Gather buffers])
        self._on_cpu = device.type == "cpu"
        self._broken: str | None = None
        self._aborted: tuple[str, tuple[int, ...], bool] | None = None
        self._owns_group = False
        self._stop = threading.Event()
        self._master = (master_addr, master_port)
        # Note [Store generations]: every group this process creates gets a fresh key prefix,
        # so a new strategy after `shutdown()` never reads the keys of an old one; rank 0 keeps
        # one store server per address for the life of the process.
        self._base = prefix
        self._prefix = f"{prefix}/{next(_GENERATIONS)}"
        self._sockets = GroupSockets(master_port)
        self._store = connect_store(master_addr, master_port, rank, world_size, timeout)
        self._meet(timeout)
        if dist.is_initialized():
            if dist.get_world_size() != world_size or dist.get_rank() != rank:
                raise RendezvousError(
                    f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}, but this worker resolved rank {rank} of "
                    f"{world_size}. Destroy the existing group or fix the cluster settings."
                )
            self._world = dist.group.WORLD
        else:
            self._init_group()
        self._liveness = self._start_liveness(
            connect_store(master_addr, master_port, rank, world_size, timeout, client=True)
        )
        atexit.register(_release_at_exit, weakref.ref(self))

    def _init_group(self) -> None:
        self._sockets.before()
        on_gpu: dict[str, Any] = {}
        if self.backend == "nccl":
            # Bound to its GPU from the start: NCCL's communicator is made now, on this
            # device, not guessed from the current device at the first collective.
            torch.cuda.set_device(self.device)
            on_gpu["device_id"] = self.device
        dist.init_process_group(
            self.backend,
            store=dist.PrefixStore(f"{self._prefix}/pg", self._store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.timeout),
            **on_gpu,
        )
        self._sockets.after()
        self._owns_group = True
        self._world = dist.group.WORLD

    def _start_liveness(self, store: Any) -> Liveness:
        liveness = Liveness(
            store,
            f"{self._prefix}/",
            self.rank,
            self.world_size,
            entered=lambda: self._entered,
            on_abort=self._abandon,
        )
        liveness.start()
        return liveness

    @property
    def prefix(self) -> str:
        """This group generation's key prefix in the rendezvous store (ends with `/`)."""
        return f"{self._prefix}/"

    @property
    def aborted(self) -> str | None:
        """Why the group was abandoned (Note [Waking a blocked collective]), else None.

        Reads the abort key when it has not been seen yet: a peer that abandons the group
        writes the key before closing its connections, so a call that just failed because of
        it finds the reason here even before the heartbeat thread does.
        """
        if self._aborted is None:
            with contextlib.suppress(Exception):
                value = self._liveness.read(f"{self._prefix}/{ABORT_KEY}")
                if value is not None:
                    self._abandon(value)
        return self._aborted[0] if self._aborted else None

    @property
    def abandoned(self) -> tuple[str, tuple[int, ...], bool] | None:
        """`(reason, ranks that never arrived, whether it follows a failure)` once the group
        was abandoned, else None."""
        return self._aborted if self.aborted is not None else None

    @property
    def entered(self) -> int:
        """How many nbdist collectives this rank has entered in this group generation (the
        one that failed included): `#12` in "released from all_reduce:SUM #12"."""
        return self._entered

    def request_abort(self, reason: str, *, missing=(), secondary: bool = False) -> None:
        """Abandon the group on every rank: each shuts its connections down within a
        heartbeat, failing the collectives blocked on them with an error naming `reason`."""
        value = encode_abort(reason, missing=missing, secondary=secondary)
        with contextlib.suppress(Exception):
            self._liveness.store.set(f"{self._prefix}/{ABORT_KEY}", value)
        self._abandon(value)

    def _abandon(self, value: str) -> None:
        if self._aborted is None:
            self._aborted = decode_abort(value)
            self._broken = self._aborted[0]
        if self.backend == "gloo":
            self._sockets.shutdown()
        elif self._owns_group and dist.is_initialized():
            # NCCL (and other backends) abort their communicators themselves; untested here
            # (CPU-only CI), and a failure to abort leaves the group's timeout in charge.
            with contextlib.suppress(Exception):
                dist.group.WORLD.abort()

    @property
    def destroyed_elsewhere(self) -> bool:
        """True when torch's default group this object created was destroyed by other code
        (`dist.destroy_process_group()` in a user's cell): its collectives cannot run until
        the group is formed again (`reform`)."""
        return self._owns_group and not dist.is_initialized()

    def reform(self, generation: str) -> None:
        """Leave the group and form a new one under `generation` (every rank, all idle).

        The processes keep their Python state (models, optimizers, this object); collectives
        count from zero again. Raises `RendezvousError` when a rank does not join in time.
        """
        if not self._owns_group:
            raise RendezvousError(
                "This process group was created outside nbdist, so nbdist cannot form it "
                "again. Restart the workers."
            )
        self._liveness.stop()
        self._release_world()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._owns_group = False
        self._stop.clear()
        self._prefix = f"{self._base}/{generation}"
        self._entered = 0
        self._async_numbers.clear()
        self._layouts.forget()
        self._broken = None
        self._aborted = None
        self._meet(self.timeout)
        self._init_group()
        self._liveness = self._start_liveness(self._liveness.store)

    # -- rendezvous and liveness ----------------------------------------------------------
    def _meet(self, timeout: float) -> None:
        identity = gpu_identity(self.device) if self.backend == "nccl" else UNKNOWN_GPU
        self._store.set(f"{self._prefix}/arrived/{self.rank}", identity)
        keys = self._wait_for_every_rank("arrived", timeout)
        if self.backend == "nccl":
            identities = [self._store.get(key).decode() for key in keys]
            # rank 0 holds the store: no rank leaves (on an error) before all have read
            self._store.set(f"{self._prefix}/identified/{self.rank}", "1")
            self._wait_for_every_rank("identified", timeout)
            check_one_gpu_each(identities, self.rank)

    def _wait_for_every_rank(self, stage: str, timeout: float) -> list[str]:
        keys = [f"{self._prefix}/{stage}/{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + timeout
        while not self._store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not self._store.check([k])]
                raise RendezvousError(
                    f"Worker(s) {missing} did not join within {timeout:g} s (this is rank "
                    f"{self.rank} of {self.world_size}). Start every worker with the same "
                    "cluster settings, or raise CommunicationOptions(timeout_seconds=...)."
                )
            self._stop.wait(0.01)
        return keys

    def publish_failure(self, message: str) -> None:
        """Tell the other ranks this one failed (read when their collective fails)."""
        self._liveness.publish_failure(message)

    def peers_waiting(self) -> list[int]:
        """Ranks that wait for this one: they entered more collectives than it has, or are
        inside a `torch.distributed` call of their own (Note [Raw collectives])."""
        return self._liveness.peers_waiting()

    def peers_in_raw_collective(self) -> list[int]:
        """Ranks whose main thread is inside a `torch.distributed` call of their own now."""
        return self._liveness.peers_in_raw_collective()

    def peer_failures(self) -> dict[int, str]:
        """The failures other ranks published and have not moved past: `{rank: message}`."""
        return self._liveness.peer_failures()

    def _diagnose(self, what: str, error: BaseException) -> Exception:
        """Name the ranks that did not take part in the failed collective `what`."""
        self._layouts.forget()
        if self.aborted is not None and self._aborted is not None:
            reason, missing, _ = self._aborted
            return WorkerLostError(
                f"{what} on rank {self.rank} of {self.world_size} was abandoned: {reason}.",
                missing=missing,
            )
        self._broken = f"{what} failed: {error}"
        return self._liveness.diagnose(what, error)

    # -- running collectives --------------------------------------------------------------
    def _collective(self, what: str, launch: Callable[[bool], Any], timeout: float | None) -> Any:
        if self._broken is not None:
            raise WorkerLostError(
                f"The process group is unusable after an earlier failure ({self._broken}). "
                "Restart the workers and create a new strategy."
            )
        self._entered += 1
        telemetry, key = self.telemetry, self._entered
        if telemetry is not None:  # in progress, for the dashboard's stuck view
            telemetry.begin(key, what, self._ranks, [time.perf_counter()])
        try:
            if timeout is None or timeout == self.timeout:
                return launch(False)
            work = launch(True)
            work.wait(timedelta(seconds=timeout))
            return work
        except RuntimeError as error:
            raise self._diagnose(what, error) from error
        finally:
            if telemetry is not None:
                telemetry.end(key)

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
        rows = self._exchange_rows(f"{what} (signature check)", _signature(what, tensors), timeout)
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
        rows = self._exchange_rows(f"{what} (signature check)", mine, timeout)
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
        if check and nbytes_in <= _INLINE_BYTES and not any(t.dtype == torch.bool for t in tensors):
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
            self._collective(
                f"all_reduce:{op.value}",
                lambda async_op, w=wire: start_all_reduce(
                    w, op, async_op=async_op, world=self._world
                ),
                timeout,
            )
            flat = wire.to(dtype) if wire.dtype != dtype else wire
            if op is ReduceOp.MEAN:
                flat = _mean(flat, self.world_size)
            offset = 0
            for i, part in zip(indices, parts):
                results[i] = flat[offset : offset + part.numel()].view(part.shape)
                offset += part.numel()
        self._record(f"all_reduce:{op.value}", nbytes, start)
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
            or self._broken is not None
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
        self._entered += 1
        telemetry, number = self.telemetry, self._entered
        if telemetry is not None:  # in progress, for the dashboard's stuck view
            telemetry.begin(number, what, self._ranks, [start])
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
                raise self._diagnose(what, error) from error
            raise
        finally:
            if telemetry is not None:
                telemetry.end(number)
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
        if telemetry is not None and telemetry.enabled:
            duration = time.perf_counter() - start
            telemetry.record(what, plan.nbytes, self.backend, self._ranks, start, duration,
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
            self._collective(
                plan.what, lambda async_op: _all_gather_flat(rows, flat, async_op=async_op), timeout
            )
            table = rows.view(self.world_size, width)
            if table[:, n].tolist().count(plan.ok) != self.world_size:
                return None
            return op.combine(list(table[:, :n].unbind(0)))
        self._all_reduce_direct(plan.what, flat, op, timeout)
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
        self._record(plan.what, plan.nbytes, start)
        return results

    def _all_reduce_direct(
        self, what: str, flat: torch.Tensor, op: ReduceOp, timeout: float | None
    ) -> None:
        """All-reduce `flat` in place through the process group itself (Note [Direct
        all-reduce]), with `_collective`'s bookkeeping."""
        self._collective(
            what,
            lambda async_op: start_all_reduce(flat, op, async_op=async_op, world=self._world),
            timeout,
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
        payload = torch.zeros(_INLINE_BYTES, dtype=torch.uint8)
        offsets = []
        offset = 0
        for tensor in tensors:
            raw = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
            offsets.append(offset)
            payload[offset : offset + raw.numel()] = raw
            offset += -(-raw.numel() // 8) * 8  # keep every tensor 8-byte aligned
        full = self._exchange_rows(what, _signature(what, tensors), timeout, payload)
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
        self._record(what, sum(t.numel() * t.element_size() for t in tensors), start)
        return results

    def _exchange_rows(
        self,
        what: str,
        signature: torch.Tensor,
        timeout: float | None,
        payload: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """All-gather one fixed-size row (signature + inline payload) per rank.

        Every checked collective sends rows of the same size, whatever it carries, so ranks
        that disagree about what they call still meet in a collective gloo can complete.
        Peers that predicted an agreed all-reduce are met first (Note [Agreed layouts]).
        """
        predicted = self._layouts.take()
        if predicted is not None:
            self._decline(predicted, timeout)
        row = torch.zeros(_ROW_WIDTH, dtype=torch.int64)
        row[:_SIGNATURE_WIDTH] = signature
        if payload is not None:
            row[_SIGNATURE_WIDTH:].view(torch.uint8)[: payload.numel()] = payload
        out = torch.empty(self.world_size * _ROW_WIDTH, dtype=torch.int64, device=self.device)
        self._collective(
            what,
            lambda async_op: _all_gather_flat(out, row.to(self.device), async_op=async_op),
            timeout,
        )
        return out.cpu().view(self.world_size, _ROW_WIDTH)

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
        self._collective(
            f"all_gather:{axis}",
            lambda async_op: _all_gather_flat(out, padded, async_op=async_op),
            timeout,
        )
        pieces = [out[r * longest : r * longest + n] for r, n in enumerate(lengths)]
        self._record(f"all_gather:{axis}", padded.numel() * padded.element_size(), start)
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
            self._collective(
                "broadcast",
                lambda async_op, f=flat: dist.broadcast(f, src, async_op=async_op),
                None,
            )
            offset = 0
            with torch.no_grad():
                for t in group:
                    t.copy_(flat[offset : offset + t.numel()].view(t.shape))
                    offset += t.numel()
        self._record("broadcast", nbytes, start)

    def all_reduce_async(self, flat: torch.Tensor) -> Any:
        """Start a SUM all-reduce of `flat` in place (gradient buckets); returns its work."""
        if self._broken is not None:
            raise WorkerLostError(f"The process group is unusable ({self._broken}).")
        self._entered += 1
        try:
            work = start_all_reduce(flat, ReduceOp.SUM, async_op=True, world=self._world)
        except RuntimeError as error:
            raise self._diagnose("gradient all_reduce", error) from error
        self._async_numbers[id(work)] = self._entered
        return work

    def wait(self, work: Any, what: str) -> None:
        """Wait for an asynchronous collective, naming the missing ranks if it fails."""
        key = self._async_numbers.pop(id(work), None)
        telemetry = self.telemetry if key is not None else None
        if telemetry is not None:  # in progress, for the dashboard's stuck view
            telemetry.begin(key, what, (self.rank,), [time.perf_counter()])
        try:
            work.wait()
        except RuntimeError as error:
            raise self._diagnose(what, error) from error
        finally:
            if telemetry is not None:
                telemetry.end(key)

    def barrier(self, *, timeout: float | None = None) -> None:
        """Wait until every rank arrives."""
        token = torch.zeros(1, device=self.device)
        self._collective(
            "barrier", lambda async_op: dist.all_reduce(token, async_op=async_op), timeout
        )

    def record(self, op: str, nbytes: int, start: float) -> None:
        """Record a collective run by someone else (gradient buckets)."""
        self._record(op, nbytes, start)

    def _record(self, op: str, nbytes: int, start: float) -> None:
        telemetry = self.telemetry
        if telemetry is not None and telemetry.enabled:
            duration = time.perf_counter() - start
            telemetry.record(op, nbytes, self.backend, self._ranks, start, duration, (duration,))

    def shutdown(self) -> None:
        """Stop the heartbeat and leave the process group (if this object created it)."""
        self._stop.set()
        self._liveness.stop()
        self._release_world()
        if self._owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._owns_group = False

    def _release_world(self) -> None:
        """Let go of the default process group, so that `torch.distributed` alone decides when
        it is destroyed (a later collective looks it up again, and fails as torch does)."""
        self._world = None
        self._prepared.clear()
        self._buffer_bytes = 0


def _release_at_exit(group_ref: weakref.ref) -> None:
    """Before the interpreter finalizes: stop a group's heartbeat thread, let go of the
    default process group, and destroy it if this group created it and nothing is in flight.

    Note [Process group at exit]: a script that ends without `strategy.shutdown()` (most do:
    TensorFlow has no such call) leaves its gloo process group to be destroyed during
    finalization, and then torch 2.13 often dies of SIGABRT ("terminate called without an
    active exception") after the script had finished: 16 of 30 launches of a raw
    `torch.distributed` script of 2 gloo workers that ends without `destroy_process_group`,
    0 of 30 when an atexit hook destroys it. So this hook destroys it while the interpreter is
    whole, which is what torch asks scripts to do. Not when an asynchronous collective was
    started and never waited for (a step that failed mid-backward) or the group was abandoned:
    destroying waits for gloo's work in flight, which could then wait for peers that never
    come (a hang at exit instead of a crash). The heartbeat thread is stopped first: a daemon
    thread caught inside a store call at finalization is unwound through C++ frames that
    cannot unwind (SIGABRT too).
    """
    group = group_ref()
    if group is None:
        return
    if not group._async_numbers and group._broken is None and group._aborted is None:
        group.shutdown()  # what a script's own strategy.shutdown() would have done
    else:
        group._liveness.stop()
        group._release_world()


def raised_in_torch_distributed(error: BaseException) -> bool:
    """True when `error` came out of a `torch.distributed` call (its traceback passes there)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(C10D_FILE):
            return True
        tb = tb.tb_next
    return False


_GENERATIONS = itertools.count()


def _all_gather_flat(output: torch.Tensor, local: torch.Tensor, async_op: bool = False) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, local, async_op=async_op)


def _compress(flat: torch.Tensor, compression: str | None) -> torch.Tensor:
    if compression is None or not flat.is_floating_point():
        return flat
    target = torch.bfloat16 if compression == "bf16" else torch.float16
    return flat if flat.dtype == target else flat.to(target)


def _mean(flat: torch.Tensor, count: int) -> torch.Tensor:
    if not (flat.is_floating_point() or flat.is_complex()):
        flat = flat.to(torch.get_default_dtype())
    return flat.div_(count)
