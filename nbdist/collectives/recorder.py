"""The collective recorder: the last N collectives of this process, always on, bounded.

Every collective a `DistGroup` runs (all of them go through one `Bookkeeping`) leaves one
entry here: its sequence number in the group (the same number on every rank), the op, the
shape and dtype of what it carried, its bytes, when it started and ended (wall clock), and
the user's call site (the first frame outside nbdist, torch and ipyparallel). The entries
live in a ring of `capacity` slots (default 2,000): memory stays flat however long training
runs, and an entry costs one list and one frame walk, in the collective's own thread.

`nd.debug.compare_collectives` lines several processes' entries up by sequence number and
names the first one where they disagree; `cluster.stacks()` reads the entry a replica is in
(or last finished). Imports nothing from nbdist.

Example:
    >>> r = CollectiveRecorder(capacity=2)
    >>> for seq in (1, 2, 3):
    ...     r.begin(seq, "all_reduce:SUM", (4,), "float32", 16)
    ...     r.end(seq)
    >>> [e["seq"] for e in r.entries()]
    [2, 3]
"""

from __future__ import annotations

import os
import sys
import time
from sys import _getframe  # CPython's frame access; see call_site
from typing import Any

__all__ = ["DEFAULT_CAPACITY", "CollectiveRecorder", "call_site", "site_of"]

DEFAULT_CAPACITY = 2_000
"""Collectives kept per process (`NBDIST_RECORDER_CAPACITY` overrides it; 0 turns it off)."""

_FIELDS = ("seq", "op", "shape", "dtype", "bytes", "start", "end", "site")
_NBDIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_library_dirs: list[str] = []
_internal: dict[str, bool] = {}  # file name -> whether its frames are skipped


def _library_prefixes() -> tuple[str, ...]:
    """Directories whose frames are not the user's: nbdist, torch, ipyparallel, ipykernel."""
    if not _library_dirs:
        for name in ("torch", "ipyparallel", "ipykernel", "IPython", "threading", "contextlib"):
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None)
            if path:  # a package's folder, a plain module's file
                folder = os.path.dirname(path) + os.sep
                _library_dirs.append(folder if path.endswith("__init__.py") else path)
        _library_dirs.append(_NBDIST_DIR)
    return tuple(_library_dirs)


def call_site(depth: int = 2) -> tuple[Any, int] | None:
    """`(code, last instruction)` of the first frame above `depth` outside nbdist, torch
    and ipyparallel (the user's call), or None when there is none (a gradient hook);
    `site_of` turns it into `(filename, line, function)` when read (a frame's `f_lineno`
    decodes its line table: most of a call's cost when read here).

    Each file is classified once (keyed by its name, whose hash Python keeps: a code object's
    hash is computed anew each time), so a call costs a few attribute reads per frame.
    """
    # CPython's own fast frame access (inspect.currentframe() plus f_back costs ~20x more, on
    # every collective); documented, and kept in every CPython release since 2.1.
    frame = _getframe(depth)
    internal = _internal
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        skip = internal.get(filename)
        if skip is None:
            skip = internal[filename] = filename.startswith(_library_prefixes())
        if not skip:
            return (code, frame.f_lasti)
        frame = frame.f_back
    return None


def site_of(site: tuple[Any, int] | None) -> tuple[str, int, str] | None:
    """`(filename, line, function)` of a `call_site`."""
    if site is None:
        return None
    code, lasti = site
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= lasti < end and number is not None:
            line = number
            break
    return (code.co_filename, line, code.co_name)


class CollectiveRecorder:
    """A ring of the last `capacity` collectives (see the module docstring).

    `begin`/`end` run on every collective; `entries`, `current` and `last_finished` are read
    rarely (a stack view, a dump), so they build dictionaries only then.
    """

    def __init__(self, capacity: int | None = None):
        if capacity is None:
            capacity = int(os.environ.get("NBDIST_RECORDER_CAPACITY", DEFAULT_CAPACITY))
        self.capacity = max(0, capacity)
        self._ring: list[list | None] = [None] * self.capacity
        self.generation = ""
        """The process group generation the entries belong to (their numbers restart with a
        new generation, so the ring is emptied then)."""
        self.previous: dict[str, Any] = {"generation": "", "entries": []}
        """The entries of the generation before (a group formed again after a failure keeps
        the failure's record here)."""

    @property
    def enabled(self) -> bool:
        """False when built with capacity 0 (for measuring what recording costs)."""
        return self.capacity > 0

    def begin(
        self, seq: int, op: str, shape: Any, dtype: Any, nbytes: int, site: Any = None
    ) -> None:
        """Record that collective `seq` started now."""
        if self.capacity:
            self._ring[seq % self.capacity] = [seq, op, shape, dtype, nbytes, time.time(),
                                                None, site]  # fmt: skip

    def end(self, seq: int) -> None:
        """Record that collective `seq` is over (finished or failed)."""
        if self.capacity:
            entry = self._ring[seq % self.capacity]
            if entry is not None and entry[0] == seq:
                entry[6] = time.time()

    def reset(self, generation: str = "") -> None:
        """Start a new process group generation (numbered from 1 again); the entries of the
        one before move to `previous` (when it had any)."""
        if any(e is not None for e in self._ring):
            self.previous = {"generation": self.generation, "entries": self.entries()}
        self._ring = [None] * self.capacity
        self.generation = generation

    def dump(self, path: str) -> str:
        """Write `entries()` (and `previous`) to `path` as JSON; returns `path`."""
        import json

        with open(path, "w") as out:
            json.dump({"generation": self.generation, "entries": self.entries(),
                       "previous": self.previous}, out, default=str)  # fmt: skip
        return path

    def entries(self) -> list[dict[str, Any]]:
        """The entries kept, oldest first, as dictionaries (picklable, for the notebook)."""
        kept = [list(e) for e in self._ring if e is not None]
        kept.sort(key=lambda e: e[0])
        return [_as_dict(e) for e in kept]

    def current(self) -> dict[str, Any] | None:
        """The newest entry: the collective this process is in, or last finished (its
        `end` is None while it runs), with `waiting_s` (seconds since it started, while it
        runs; else 0)."""
        newest = None
        for entry in self._ring:
            if entry is not None and (newest is None or entry[0] > newest[0]):
                newest = entry
        if newest is None:
            return None
        found = _as_dict(list(newest))
        found["waiting_s"] = time.time() - found["start"] if found["end"] is None else 0.0
        return found

    def __len__(self) -> int:
        return sum(e is not None for e in self._ring)


def _as_dict(entry: list) -> dict[str, Any]:
    found = dict(zip(_FIELDS, entry))
    shape = found["shape"]
    found["shape"] = tuple(shape) if shape is not None else None
    found["dtype"] = str(found["dtype"]).replace("torch.", "") if found["dtype"] else None
    found["site"] = site_of(found["site"])
    return found
