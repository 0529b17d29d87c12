"""One replica's live stack (`ReplicaStack`), and the grouped view `%dist stack` prints.

Replicas whose main threads have the same stack are printed once ("replicas 0, 2, 3:"),
each with its own line naming the collective it is in (or last finished): op, sequence
number, bytes, and how long it has waited. Frames of nbdist, torch, ipyparallel and the other
libraries under the user's code are folded into one line per run unless `all_frames`; the
user's frames keep their source line.

Example:
    >>> s = ReplicaStack(replica=0, host="h", pid=1, state="running",
    ...                  threads={"MainThread": [("train.py", 42, "step", "loss = f(x)")]},
    ...                  collective={"op": "all_reduce:SUM", "seq": 7, "bytes": 16,
    ...                              "waiting_s": 8.25, "end": None})
    >>> print(format_stacks([s]))
    replica 0 (pid 1 on h): in all_reduce:SUM #7 (16 B) for 8.2 s
      File "train.py", line 42, in step
        loss = f(x)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

from nbdist.core.units import format_bytes

__all__ = ["ReplicaStack", "format_stacks"]

Frame = tuple[str, int, str, str]  # (filename, lineno, function, line)


@dataclasses.dataclass(frozen=True)
class ReplicaStack:
    """One replica's threads, taken live (`cluster.stacks()`).

    Attributes:
        replica: Its replica id (its engine's rank).
        host: The host its engine runs on.
        pid: The engine's process id there.
        state: `"running"` (it answered), `"dead"` (its process is gone) or `"no answer"`
            (it did not answer within the timeout).
        threads: Thread name → frames `(filename, lineno, function, line)`, outermost
            first; the main thread is `"MainThread"`. Empty unless running.
        collective: The collective it is in (`end` None) or last finished: `op`, `seq`,
            `bytes`, `waiting_s`, `shape`, `dtype`, `start`, `end`, `site`; None when it
            has run none.
        note: Why there are no threads (a dead or silent engine), else "".
    """

    replica: int
    host: str
    pid: int
    state: str
    threads: dict[str, list[Frame]] = dataclasses.field(default_factory=dict)
    collective: dict[str, Any] | None = None
    note: str = ""

    @property
    def main(self) -> list[Frame]:
        """The main thread's frames (outermost first)."""
        return self.threads.get("MainThread", [])


def format_stacks(
    stacks: Sequence[ReplicaStack],
    *,
    all_frames: bool = False,
    all_threads: bool = False,
    rename: Callable[[str], str] | None = None,
) -> str:
    """The grouped view of `stacks` (see the module docstring).

    Args:
        all_frames: Print every frame (`%dist stack --all`), not only the user's.
        all_threads: Print every thread, not only the main thread (`--all` too).
        rename: Maps a `File "...", line N` line to the name the editor shows
            (`Cell In[6], line 3`).
    """
    lines: list[str] = []
    groups: dict[tuple, list[ReplicaStack]] = {}
    silent = []
    for stack in sorted(stacks, key=lambda s: s.replica):
        if stack.state != "running":
            silent.append(stack)
            continue
        key = tuple((f, n, fn) for f, n, fn, _ in stack.main)
        groups.setdefault(key, []).append(stack)
    for members in groups.values():
        if len(members) > 1:
            lines.append(f"replicas {_ranges([m.replica for m in members])}:")
            lines += [f"  replica {m.replica}: {_where(m, rename)}" for m in members]
        else:
            lines.append(f"replica {members[0].replica} (pid {members[0].pid} on "
                         f"{members[0].host}): {_where(members[0], rename)}")  # fmt: skip
        lines += _frames(members[0].main, all_frames, rename)
        if all_threads:
            for name, frames in members[0].threads.items():
                if name != "MainThread":
                    lines.append(f"  thread {name}:")
                    lines += ["  " + line for line in _frames(frames, all_frames, rename)]
    for stack in silent:
        lines.append(f"replica {stack.replica} (pid {stack.pid} on {stack.host}): "
                     f"{stack.state}" + (f": {stack.note}" if stack.note else ""))  # fmt: skip
    return "\n".join(lines)


def _where(stack: ReplicaStack, rename: Callable[[str], str] | None = None) -> str:
    c = stack.collective
    own = [f for f in stack.main if _library(f[0]) is None]
    now = "now idle"
    if own:
        filename, lineno, function, _ = own[-1]
        at = f'File "{filename}", line {lineno}'
        renamed = rename(at) if rename else at
        now = f"now at {renamed if renamed != at else f'{filename}:{lineno}'} in {function}"
    if not c:
        return f"no collective yet; {now}"
    what = f"{c['op']} #{c['seq']} ({format_bytes(c.get('bytes') or 0)})"
    if c.get("end") is None:
        return f"in {what} for {c.get('waiting_s', 0.0):.1f} s"
    return f"finished {what}; {now}"


def _frames(
    frames: Sequence[Frame], all_frames: bool, rename: Callable[[str], str] | None
) -> list[str]:
    out: list[str] = []
    folded: list[str] = []

    def flush() -> None:
        if folded:
            names = ", ".join(dict.fromkeys(folded))
            out.append(f"  ... {len(folded)} frame{'s' if len(folded) > 1 else ''} in {names}")
            folded.clear()

    for filename, lineno, function, line in frames:
        library = _library(filename)
        if library and not all_frames:
            folded.append(library)
            continue
        flush()
        where = f'  File "{filename}", line {lineno}, in {function}'
        out.append(rename(where) if rename else where)
        if line:
            out.append(f"    {line.strip()}")
    if not all_frames:
        flush()
    return out


def _ranges(replicas: list[int]) -> str:
    """`0, 2, 3` or `0-6` for a run of more than two."""
    parts, run = [], [replicas[0]]
    for r in replicas[1:]:
        if r == run[-1] + 1:
            run.append(r)
        else:
            parts.append(run)
            run = [r]
    parts.append(run)
    return ", ".join(f"{p[0]}-{p[-1]}" if len(p) > 2 else ", ".join(map(str, p)) for p in parts)


_NBDIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = tuple(
    {sysconfig.get_paths()["stdlib"] + os.sep, os.path.dirname(os.__file__) + os.sep,
     sys.base_prefix + os.sep + "lib" + os.sep}
)  # fmt: skip


_RUNNERS = ("<string>",)  # code run by exec() of a string: ipyparallel's apply, `python -c`


def _library(filename: str) -> str | None:
    """The library a frame's file belongs to (`"torch"`, `"nbdist"`, `"python"`), or None
    for the user's own code."""
    if filename.startswith(_NBDIST):
        return "nbdist"
    for marker in ("site-packages", "dist-packages"):
        at = filename.find(f"{os.sep}{marker}{os.sep}")
        if at >= 0:
            rest = filename[at + len(marker) + 2 :]
            return rest.split(os.sep, 1)[0].removesuffix(".py")
    if filename.startswith(_STDLIB) or filename in _RUNNERS or filename.startswith("<frozen"):
        return "python"
    return None
