"""`%dist stack [--all] [--collectives]`, and the stack view shown under a `%%distribute` cell
that has waited `--stack-after S` seconds in a collective.

Both read the engines' stack servers (`nbdist.cluster.stacks`), which answer from their own
thread while the cell runs: nothing on the engines changes, and the cell goes on.

Example (in a notebook, also while another cell runs)::

    %dist stack                  # grouped main-thread stacks, the user's frames
    %dist stack --all            # every frame of every thread
    %dist stack --collectives    # plus the first collective where the replicas disagree
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from IPython.core.error import UsageError

from nbdist.cluster import cell_names
from nbdist.cluster.debug_prompt import debug_notes
from nbdist.cluster.stacks import ask_engines
from nbdist.debug import compare_collectives, format_stacks

__all__ = ["DEFAULT_STACK_AFTER", "StackWatch", "stack_command", "stack_view", "watch"]

DEFAULT_STACK_AFTER = 30.0
"""Seconds a `%%distribute` cell waits in a collective before its stack view is shown."""
_POLL_S = 1.0  # how often a watch asks the engines once the threshold has passed


def stack_view(cluster: Any, *, all_frames: bool = False, timeout: float = 2.0) -> str:
    """The grouped stack view of `cluster`'s engines, with a header line."""
    began = time.monotonic()
    stacks = cluster.stacks(timeout=timeout)
    took = time.monotonic() - began
    body = format_stacks(stacks, all_frames=all_frames, all_threads=all_frames,
                         rename=cell_names.rename)  # fmt: skip
    return f"Stacks of {len(stacks)} replicas (taken in {took:.2f} s):\n{body}"


def stack_command(cluster: Any, words: list[str]) -> None:
    """`%dist stack [--all] [--collectives]`: print the view (see the module docstring)."""
    unknown = [w for w in words if w not in ("--all", "--collectives")]
    if unknown:
        raise UsageError(
            f"%dist stack: unknown argument(s) {unknown}. Use: %dist stack [--all] [--collectives]"
        )
    if cluster is None or not cluster.running:
        raise UsageError(
            "%dist stack shows the engines' stacks, but no cluster is running: start one with "
            "`%dist start` (e.g. `%dist start -n 2`)."
        )
    print(stack_view(cluster, all_frames="--all" in words))
    if "--collectives" in words:
        records = cluster.collective_records()
        found = compare_collectives(records)
        last = {r: entries[-1]["seq"] for r, entries in records.items() if entries}
        if found is not None:
            print(f"Collectives disagree at {found}")
        elif last:
            newest = max(last.values())
            print(f"Collectives agree: every replica's recorder matches (newest #{newest}).")
        else:
            print("No collective recorded yet.")


class StackWatch:
    """A thread that, once a cell has run `after` seconds, asks the engines every second
    whether one of them has waited `after` seconds in a collective, and prints the stack view
    once when one has (`view` keeps it, for the cell's error)."""

    def __init__(self, cluster: Any, after: float):
        self.cluster = cluster
        self.after = after
        self.view: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbdist-stack-watch", daemon=True)

    def start(self) -> None:
        """Start watching (the thread prints into the running cell's output)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the cell is over)."""
        self._done.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        if self._done.wait(self.after):
            return
        while not self._done.is_set():
            waited = self._longest_wait()
            if waited is not None and waited >= self.after and not debug_notes(self.cluster):
                # (not while a replica is stopped in the debugger: its peers wait on purpose)
                with contextlib.suppress(Exception):  # the cluster stopped under us
                    self.view = stack_view(self.cluster)
                    print(
                        f"nbdist: a collective has waited {waited:.0f} s (--stack-after "
                        f"{self.after:g}); the cell goes on.\n{self.view}",
                        flush=True,
                    )
                return
            self._done.wait(_POLL_S)

    def _longest_wait(self) -> float | None:
        try:
            answers = ask_engines(self.cluster.engines, "collective", 2.0)
        except Exception:  # the cluster stopped under us
            return None
        waits = [
            reply["time"] - reply["collective"]["start"]
            for reply, _ in answers.values()
            if reply and reply.get("collective") and reply["collective"].get("end") is None
        ]
        return max(waits) if waits else None


@contextlib.contextmanager
def watch(cluster: Any, after: float) -> Iterator[StackWatch | None]:
    """Watch a `%%distribute` cell for `after` seconds in a collective (0: never)."""
    if not after:
        yield None
        return
    watcher = StackWatch(cluster, after)
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.stop()
