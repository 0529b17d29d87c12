"""Collective timeouts that stop counting while a replica is held in the debugger.

Note [Held replicas]: a replica stopped at `breakpoint()` on an engine (or in `%dist debug`)
does not reach the next collective, and its peers wait there for it. Gloo enforces the
collective timeout in C++, from the moment the collective started, and cannot be told to wait
longer for a collective already in progress. So on the engines (`enable()`, called by their
bootstrap) a gloo group is formed with a long timeout (`LONG_TIMEOUT_S`) and the collective
timeout the user chose is enforced here instead, by each rank's heartbeat thread
(`TimeoutWatch`, called from `Liveness`):

- a rank in the debugger says so in its heartbeat (`held()` around the prompt; the field
  `hold_field()` is "H" while held, else when its last hold ended);
- a rank whose main thread has waited in a collective for longer than the timeout, counted
  from when it started or from when the last peer left the debugger, whichever is later, and
  while no peer is held, fails it as gloo would have: it names the missing ranks
  (`Liveness.diagnose`, the same `CollectiveTimeoutError`) and abandons the group on every
  rank (Note [Waking a blocked collective] in `nbdist.collectives.abort`), which ends the
  blocked call at once with that error.

So the timeout is suspended while any replica is held and resumes, in full, when the last one
leaves the debugger. Where a group's connections cannot be shut down (no `/proc`, no psutil),
the collective recorder is off (`NBDIST_RECORDER_CAPACITY=0`) or the backend is NCCL, gloo or
NCCL keep the timeout and nothing is suspended.

Example:
    >>> with held():
    ...     hold_field()
    'H'
    >>> expired(start=100.0, now=131.0, timeout=30.0, beats={1: "130.0 4 0 0"})
    True
    >>> expired(start=100.0, now=131.0, timeout=30.0, beats={1: "130.0 4 0 H"})
    False
    >>> expired(start=100.0, now=131.0, timeout=30.0, beats={1: "130.0 4 0 120.000"})
    False
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "LONG_TIMEOUT_S",
    "TimeoutWatch",
    "enable",
    "enabled",
    "expired",
    "held",
    "hold_field",
    "is_held",
]

LONG_TIMEOUT_S = 24 * 3600.0
"""Gloo's own timeout on groups whose collective timeout is enforced by `TimeoutWatch`: how
long a replica may stay in the debugger while its peers wait."""

_state: dict[str, Any] = {"enabled": False, "depth": 0, "ended": 0.0}
_COLLECTIVES_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def enable() -> None:
    """Let groups formed from now on in this process suspend their collective timeout while a
    replica is held (Note [Held replicas]); the engines' bootstrap calls it."""
    _state["enabled"] = True


def enabled() -> bool:
    """True when `enable()` was called in this process."""
    return bool(_state["enabled"])


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Mark this process as held in the debugger while the block runs (peers then do not
    count the time against their collective timeout)."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        _state["ended"] = time.time()


def is_held() -> bool:
    """True while this process is inside `held()`."""
    return _state["depth"] > 0


def hold_field() -> str:
    """This process's hold in its heartbeat: "H" while held, else the wall-clock time its
    last hold ended ("0" when never)."""
    if _state["depth"] > 0:
        return "H"
    ended = _state["ended"]
    return f"{ended:.3f}" if ended else "0"


def expired(start: float, now: float, timeout: float, beats: dict[int, str | None]) -> bool:
    """Whether a collective that started at `start` (wall clock) has now outlived `timeout`,
    given the peers' heartbeats (`"TIME ENTERED RAW HOLD"`): never while a peer is held, and
    counted from the end of the latest hold when that is later than `start`."""
    latest = start
    for beat in beats.values():
        fields = (beat or "").split()
        if len(fields) < 4:
            continue
        if fields[3] == "H":
            return False
        with contextlib.suppress(ValueError):
            latest = max(latest, float(fields[3]))
    return now - latest > timeout


class TimeoutWatch:
    """Enforces one group's collective timeout from its heartbeat thread (Note [Held
    replicas]).

    Args:
        timeout: The collective timeout, in seconds.
        current: Returns `(what, start)` of the collective the main thread is in (wall clock),
            or None.
        fire: Called once per collective that outlived the timeout, with the error the
            blocked rank must raise (it abandons the group).
    """

    def __init__(
        self,
        timeout: float,
        current: Callable[[], tuple[str, float] | None],
        fire: Callable[[Exception], None],
    ):
        self.timeout = timeout
        self._current = current
        self._fire = fire
        self._raw_since: float | None = None
        self._fired: tuple | None = None

    def check(self, liveness: Any, raw: bool) -> None:
        """Look once (every heartbeat): fire when the main thread's collective, or its own
        `torch.distributed` call (`raw`), has outlived the timeout."""
        now = time.time()
        self._raw_since = (self._raw_since or now) if raw else None
        found = self._current()
        if found is None and self._raw_since is not None:
            found = ("a torch.distributed call", self._raw_since)
        if found is None or now - found[1] <= self.timeout or self._fired == found:
            return
        if not _main_thread_in_collective():
            return
        if not expired(found[1], now, self.timeout, liveness.heartbeats()):
            return
        self._fired = found
        self._fire(liveness.diagnose(found[0], TimeoutError(f"timed out after {self.timeout:g} s")))


def _main_thread_in_collective() -> bool:
    """True when the main thread is inside one of nbdist's collectives or `torch.distributed`
    (an entry the recorder never saw end, e.g. a bucket never waited for, does not count)."""
    from nbdist._private_api import c10d_file, thread_frames

    frame = thread_frames().get(threading.main_thread().ident)
    c10d = c10d_file()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith(c10d) or os.path.abspath(filename).startswith(_COLLECTIVES_DIR):
            return True
        frame = frame.f_back
    return False
