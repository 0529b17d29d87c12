"""The process group itself: rendezvous, the group formed (and formed again), abandoning it on
every rank, the peers' liveness, and leaving it. `nbdist.collectives.torch_dist.DistGroup`
adds the collectives (`checked`, `all_reduce`); every one of them is counted, timed, recorded
and diagnosed by the group's `Bookkeeping` (`nbdist.collectives.bookkeeping`).

Example (on every rank; `DistGroup` is what strategies create)::

    group = DistGroup(rank=r, world_size=2, master_addr="127.0.0.1", master_port=29500,
                      backend="gloo", device=torch.device("cpu"), timeout=30)
    group.reform("g1")      # every rank, all idle
    group.shutdown()
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nbdist._private_api import set_group_timeout
from nbdist.collectives import agreed, held
from nbdist.collectives.abort import ABORT_KEY, GroupSockets, abort_kind, decode_abort, encode_abort
from nbdist.collectives.bookkeeping import Bookkeeping
from nbdist.collectives.direct import Prepared
from nbdist.collectives.gpu_sharing import UNKNOWN as UNKNOWN_GPU
from nbdist.collectives.gpu_sharing import check_one_gpu_each, gpu_identity
from nbdist.collectives.liveness import Liveness
from nbdist.collectives.recorder import CollectiveRecorder
from nbdist.collectives.store import connect_store
from nbdist.errors import RendezvousError
from nbdist.telemetry.records import Telemetry

__all__ = ["GroupLifecycle"]


class GroupLifecycle:
    """The group part of `DistGroup` (see the module docstring); not used alone."""

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
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self._layouts = agreed.AgreedLayouts()  # Note [Agreed layouts]
        # Count, telemetry, recorder and diagnosis of every collective, in one place.
        self._books = Bookkeeping(
            rank=rank,
            world_size=world_size,
            backend=backend,
            telemetry=telemetry,
            abandoned=lambda: self.abandoned,
            diagnose_lost=lambda what, error: self._liveness.diagnose(what, error),
            forget_layouts=self._layouts.forget,
            abandon_kind=lambda: self._abort_kind,
        )
        # The default group, read once per group formed (`dist.group.WORLD` is a property over
        # a lookup, two Python calls per collective: Note [Calls per collective]); None once
        # released (`_release_world`).
        self._world: Any = None
        # The hot path's constants per agreed layout (Note [Prepared layouts]).
        self._prepared: dict[tuple, Prepared | bool] = {}
        self._buffer_bytes = 0  # of the prepared layouts' gather buffers (Note [Gather buffers])
        self._on_cpu = device.type == "cpu"
        self._aborted: tuple[str, tuple[int, ...], bool] | None = None
        self._abort_kind: str | None = None  # the error a timeout's abandon raises
        self._watching = False  # Note [Held replicas]: the timeout is enforced by the heartbeat
        self._owns_group = False
        self._stop = threading.Event()
        self._master = (master_addr, master_port)
        # Note [Store generations]: every group this process creates gets a fresh key prefix,
        # so a new strategy after `shutdown()` never reads the keys of an old one; rank 0 keeps
        # one store server per address for the life of the process.
        self._base = prefix
        self._prefix = f"{prefix}/{next(_GENERATIONS)}"
        self._books.recorder.generation = self._prefix
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
        self._watching = (  # the watch needs to abandon the group and to see its collectives
            held.enabled()
            and self.backend == "gloo"
            and self._sockets.count > 0
            and self._books.recorder.enabled
        )
        if self._watching:  # Note [Held replicas]: the heartbeat enforces self.timeout
            long = timedelta(seconds=max(self.timeout, held.LONG_TIMEOUT_S))
            set_group_timeout(long, self._world)

    def _start_liveness(self, store: Any) -> Liveness:
        liveness = Liveness(
            store,
            f"{self._prefix}/",
            self.rank,
            self.world_size,
            entered=lambda: self._books.entered,
            on_abort=self._abandon,
            watch=held.TimeoutWatch(self.timeout, self._current_collective, self._time_out)
            if self._watching
            else None,
        )
        liveness.start()
        return liveness

    def _current_collective(self) -> tuple[str, float] | None:
        """`(what, start)` of the collective in progress on this rank, or None."""
        found = self._books.recorder.current()
        if found is None or found["end"] is not None:
            return None
        return str(found["op"]), float(found["start"])

    def _time_out(self, error: Exception) -> None:
        """The collective outlived the timeout (Note [Held replicas]): abandon the group on
        every rank, so that the blocked call raises `error`'s class with its message."""
        self.request_abort(
            str(error), missing=getattr(error, "missing", ()), kind=type(error).__name__
        )

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
        return self._books.entered

    @property
    def telemetry(self) -> Telemetry | None:
        """Where this group's collectives are recorded for the dashboard, or None."""
        return self._books.telemetry

    @telemetry.setter
    def telemetry(self, telemetry: Telemetry | None) -> None:
        self._books.telemetry = telemetry

    @property
    def recorder(self) -> CollectiveRecorder:
        """The last collectives of this process (`nbdist.collectives.recorder`)."""
        return self._books.recorder

    def request_abort(
        self, reason: str, *, missing=(), secondary: bool = False, kind: str | None = None
    ) -> None:
        """Abandon the group on every rank: each shuts its connections down within a
        heartbeat, failing the collectives blocked on them with an error naming `reason`
        (of class `kind`, e.g. `"CollectiveTimeoutError"`; default `WorkerLostError`)."""
        value = encode_abort(reason, missing=missing, secondary=secondary, kind=kind)
        with contextlib.suppress(Exception):
            self._liveness.store.set(f"{self._prefix}/{ABORT_KEY}", value)
        self._abandon(value)

    def _abandon(self, value: str) -> None:
        if self._aborted is None:
            self._aborted = decode_abort(value)
            self._abort_kind = abort_kind(value)
            self._books.broken = self._aborted[0]
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
        self._books.reset(self._prefix)
        self._layouts.forget()
        self._aborted = None
        self._abort_kind = None
        self._meet(self.timeout)
        self._init_group()
        self._liveness = self._start_liveness(self._liveness.store)

    def resize(
        self, *, rank: int, world_size: int, master_addr: str, master_port: int, generation: str
    ) -> None:
        """Leave the group and form one of `world_size` ranks as `rank`, meeting at a fresh
        rendezvous store `master_addr:master_port` under `generation` (`%dist scale`: every
        rank of the new group at once, engines that join for the first time included, whose
        first group takes generation "0").

        Like `reform`, the process keeps its Python state; raises `RendezvousError` when a rank
        does not join in time.
        """
        if not self._owns_group:
            self.reform(generation)  # raises the error for a group made outside nbdist
        self._liveness.stop()
        self.rank, self.world_size = rank, world_size
        self._books.rank, self._books.world_size = rank, world_size
        self._books.ranks = (rank,)
        self._master = (master_addr, master_port)
        self._sockets = GroupSockets(master_port)
        self._store = connect_store(master_addr, master_port, rank, world_size, self.timeout)
        self._liveness.store = connect_store(
            master_addr, master_port, rank, world_size, self.timeout, client=True
        )
        self.reform(generation)

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

    @property
    def broken(self) -> str | None:
        """Why the group is unusable (an earlier collective failed), else None."""
        return self._books.broken

    def release_at_exit(self) -> None:
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
        books = self._books
        if not books.async_numbers and books.broken is None and self._aborted is None:
            self.shutdown()  # what a script's own strategy.shutdown() would have done
        else:
            self._liveness.stop()
            self._release_world()


def _release_at_exit(group_ref: weakref.ref) -> None:
    """`group.release_at_exit()`, if the group still exists (an atexit hook)."""
    group = group_ref()
    if group is not None:
        group.release_at_exit()


_GENERATIONS = itertools.count()
