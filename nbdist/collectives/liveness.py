"""`Liveness`: each rank's heartbeat and failure notices, kept in the rendezvous store.

Note [Naming the missing rank]: each rank publishes a heartbeat (time and how many collectives
it has entered) to the rendezvous store from a background thread. When a collective fails or
times out, the survivors read the heartbeats and name the ranks that died, failed or never
arrived.

Note [Raw collectives]: user code may call `torch.distributed` directly (`dist.all_reduce` in
a notebook cell). Those calls are not counted, so the heartbeat also says whether the main
thread is inside `torch.distributed` right now other than through nbdist's collectives (read
from its Python stack). A rank that failed or finished then knows its peers wait for it there
too, and abandons the group on every rank (`DistGroup.request_abort`; Note [Waking a blocked
collective] in `nbdist.collectives.abort`), which fails their calls at once. The heartbeat
thread also reads the group's abort key, and acts on it (`on_abort`).

Example:
    >>> _current_failure("3 ValueError: bad", "1700000000.0 3 0")
    'ValueError: bad'
    >>> _current_failure("3 ValueError: bad", "1700000000.0 5 0") is None  # moved past it
    True
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from nbdist._private_api import c10d_file, thread_frames
from nbdist.collectives import held
from nbdist.errors import CollectiveTimeoutError, WorkerLostError

__all__ = ["C10D_FILE", "HEARTBEAT_SECONDS", "Liveness"]

HEARTBEAT_SECONDS = 0.5
"""Seconds between a rank's heartbeats."""

C10D_FILE = c10d_file()
"""The path of torch's module of collectives (`torch.distributed.*` calls)."""

_COLLECTIVES_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Liveness:
    """One rank's view of the others: its heartbeat out, their heartbeats and failures in.

    Args:
        store: A client of the rendezvous store (its own connection: used from a thread).
        prefix: The key prefix of this process group generation (ends with `/`).
        rank, world_size: This rank and the group's size.
        entered: Returns how many collectives this rank has entered so far.
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        rank: int,
        world_size: int,
        entered: Callable[[], int],
        on_abort: Callable[[str], None] | None = None,
        watch: Any = None,
    ):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        self._entered = entered
        self._on_abort = on_abort
        self._watch = watch
        """A `held.TimeoutWatch` enforcing the collective timeout (Note [Held replicas]), or
        None (gloo's own timeout applies)."""
        self.aborted: str | None = None
        """The abort key's value once seen (Note [Waking a blocked collective])."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"nbdist-heartbeat-{rank}", daemon=True
        )

    def start(self) -> None:
        """Publish the first heartbeat, then one every `HEARTBEAT_SECONDS` from a thread."""
        self._beat_once()
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat (peers then see this rank as stopped) and wait for its thread.

        Waiting matters: a heartbeat thread still inside the store client when the
        interpreter exits aborts the process (SIGABRT).
        """
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def publish_failure(self, message: str) -> None:
        """Tell the other ranks this one failed (read when their collective fails)."""
        with contextlib.suppress(Exception):
            self.store.set(f"{self.prefix}failed/{self.rank}", f"{self._entered()} {message[:500]}")

    def peers_waiting(self) -> list[int]:
        """Ranks that wait for this one: they entered more collectives than it has, or are
        inside a `torch.distributed` call of their own (Note [Raw collectives])."""
        entered = self._entered()

        def waits(beat: str) -> bool:
            fields = beat.split()
            return int(fields[1]) > entered or fields[2:3] == ["1"]

        beats = self.heartbeats()
        return sorted(rank for rank, beat in beats.items() if beat is not None and waits(beat))

    def peers_in_raw_collective(self) -> list[int]:
        """Ranks whose main thread is inside a `torch.distributed` call of their own now."""
        beats = self.heartbeats()
        return sorted(r for r, beat in beats.items() if beat and beat.split()[2:3] == ["1"])

    def peer_failures(self) -> dict[int, str]:
        """The failures other ranks published and have not moved past: `{rank: message}`."""
        beats = self.heartbeats()
        found = {}
        for r in beats:
            failed = _current_failure(self.read(f"{self.prefix}failed/{r}"), beats[r])
            if failed is not None:
                found[r] = failed
        return found

    def diagnose(self, what: str, error: BaseException) -> Exception:
        """The error for the failed collective `what`, naming the ranks that did not take part
        (Note [Naming the missing rank]); waits up to about three heartbeats to tell a rank
        that stopped from one that is alive."""
        entered = self._entered()
        first = self.heartbeats()
        deadline = time.monotonic() + 2.5 * HEARTBEAT_SECONDS + 1.0
        latest = first
        while time.monotonic() < deadline and any(v is not None for v in first.values()):
            self._stop.wait(0.1)
            latest = self.heartbeats()
            if all(latest[r] != first[r] for r in latest if first[r] is not None):
                break
        problems: dict[int, str] = {}
        for r in latest:
            failed = _current_failure(self.read(f"{self.prefix}failed/{r}"), latest.get(r))
            if failed is not None:
                problems[r] = f"rank {r} raised an error: {failed}"
            elif latest.get(r) is None:
                problems[r] = f"rank {r} is unreachable (the rendezvous on rank 0 may be gone)"
            elif latest[r] == first[r]:
                problems[r] = f"rank {r} stopped responding (its process exited or hung)"
            elif int(str(latest[r]).split()[1]) < entered:
                problems[r] = (
                    f"rank {r} never called this collective (it has entered "
                    f"{str(latest[r]).split()[1]} collectives, this rank {entered})"
                )
        missing = tuple(sorted(problems))
        detail = "; ".join(problems.values()) or f"the backend reported: {error}"
        timed_out = "timed out" in str(error).lower() or "timeout" in str(error).lower()
        message = (
            f"{what} on rank {self.rank} of {self.world_size} failed: {detail}. Make every "
            "worker run the same collectives; a worker that died must be restarted together "
            "with the others (create a new strategy on every worker)."
        )
        if timed_out and not any("raised" in p or "stopped" in p for p in problems.values()):
            return CollectiveTimeoutError(message, missing=missing)
        return WorkerLostError(message, missing=missing)

    def heartbeats(self) -> dict[int, str | None]:
        """The other ranks' latest heartbeats (`"TIME ENTERED RAW HOLD"`; HOLD: Note [Held
        replicas] in `nbdist.collectives.held`), None where missing."""
        return {
            r: self.read(f"{self.prefix}hb/{r}") for r in range(self.world_size) if r != self.rank
        }

    # -- internals ------------------------------------------------------------------------
    def _beat_once(self) -> None:
        raw = int(_in_raw_collective(threading.main_thread().ident))
        self.store.set(
            f"{self.prefix}hb/{self.rank}",
            f"{time.time():.3f} {self._entered()} {raw} {held.hold_field()}",
        )
        if self._watch is not None and self.aborted is None:
            self._watch.check(self, bool(raw))
        if self.aborted is None and self._on_abort is not None:
            from nbdist.collectives.abort import ABORT_KEY

            value = self.read(f"{self.prefix}{ABORT_KEY}")
            if value is not None:
                self.aborted = value
                self._on_abort(value)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._beat_once()
            except Exception:
                return

    def read(self, key: str) -> str | None:
        """The value of `key` in the store, None when missing or unreachable."""
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode()
        except Exception:
            return None


def _in_raw_collective(thread_id: int | None) -> bool:
    """True when thread `thread_id` is inside a `torch.distributed` call that did not come
    through nbdist's collectives (Note [Raw collectives])."""
    frame = thread_frames().get(thread_id) if thread_id is not None else None
    inside = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if os.path.abspath(filename).startswith(_COLLECTIVES_DIR):
            return False  # one of nbdist's collectives: counted in the heartbeat already
        if filename.endswith(C10D_FILE):
            inside = True
        frame = frame.f_back
    return inside


def _current_failure(notice: str | None, heartbeat: str | None) -> str | None:
    """The failure a rank published, unless it has entered collectives since (stale)."""
    if notice is None:
        return None
    count, _, message = notice.partition(" ")
    if heartbeat is not None and count.isdigit() and int(heartbeat.split()[1]) > int(count):
        return None
    return message
