"""Showing what the engines print and display, live: the one output printer of every call.

`OutputPrinter` reads each engine's request as it runs (ipyparallel collects the engine's
stdout, stderr and displayed outputs on its AsyncResult) and shows every new complete line
once, prefixed by the replica id (`[1] loss 0.25`), on the notebook's stdout or stderr, and
republishes what an engine displayed (figures, HTML) in the running kernel. The supervisor
(`nbdist.cluster.supervisor.supervise`) polls it while it waits and finishes it once the
replies are in, for `strategy.run`, `run_steps`, `push`, `pull` and `%%distribute` alike.

Subclasses change where the output goes, not how it is read: the `%%distribute` printer draws
progress bars too (`magics._cell`), and `--output tabs` writes each replica into its own tab
(`magics._tabs`). They override `write_lines` and `show`.

Example:
    >>> OutputPrinter(mode="all").line(3, "hello")
    '[3] hello'
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from nbdist.cluster.status import EngineInfo

__all__ = [
    "OUTPUT_MODES",
    "OUTPUT_WAIT_S",
    "OutputPrinter",
    "display_outputs",
    "say_late_output",
    "stream_text",
    "wait_for_outputs",
]

OUTPUT_MODES = ("all", "first", "none")
"""What a printer shows: every replica's output, the first target's only, or nothing."""
OUTPUT_WAIT_S = 10.0
"""Seconds, in all, to wait for engines' printed output after their replies
(Note [Output after the reply])."""


class OutputPrinter:
    """Shows the engines' output as it arrives: `[N] line` per printed line, and their
    displayed outputs republished (where a kernel runs).

    Args:
        mode: One of `OUTPUT_MODES`.
    """

    def __init__(self, mode: str = "all"):
        if mode not in OUTPUT_MODES:
            from nbdist.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"output must be one of {OUTPUT_MODES}, got {mode!r}; e.g. output='all'."
            )
        self.mode = mode
        self.engines: list[EngineInfo] = []
        self.parts: list[Any] = []
        self._seen: dict[tuple[int, str], int] = {}
        self._pending: dict[tuple[int, str], str] = {}
        self._displayed: dict[int, int] = {}

    def start(self, engines: Sequence[EngineInfo], parts: list[Any]) -> None:
        """Begin reading `parts` (one AsyncResult per engine, in `engines` order)."""
        self.engines = list(engines)
        self.parts = parts

    def shown(self) -> list[int]:
        """Indices (into `engines`) of the replicas whose output is shown."""
        if self.mode == "none":
            return []
        return [0] if self.mode == "first" and self.parts else list(range(len(self.parts)))

    def line(self, rank: int, text: str) -> str:
        """One printed line as shown: prefixed by the replica id."""
        return f"[{rank}] {text}"

    def poll(self, final: bool = False) -> None:
        """Show what arrived since the last poll; with `final`, a last unterminated line too."""
        for index in self.shown():
            info, part = self.engines[index], self.parts[index]
            for name in ("stdout", "stderr"):
                lines = self._new_lines(info.rank, part, name, final)
                if lines:
                    self.write_lines(info.rank, name, lines)
            outputs = display_outputs(part)
            for output in outputs[self._displayed.get(info.rank, 0) :]:
                if output.get("data"):
                    self.show(info.rank, output["data"], output.get("metadata") or {})
            self._displayed[info.rank] = len(outputs)

    def finish(self) -> None:
        """Wait (`OUTPUT_WAIT_S` at most) for the rest of the shown engines' output, show it,
        and name the replicas whose output did not arrive in time."""
        shown = self.shown()
        late = wait_for_outputs([self.parts[i] for i in shown], [self.engines[i] for i in shown])
        self.poll(final=True)
        say_late_output(late)

    def write_lines(self, rank: int, stream_name: str, lines: list[str]) -> None:
        """Print complete lines of replica `rank`'s `stream_name` ("stdout" or "stderr")."""
        stream: TextIO = sys.stdout if stream_name == "stdout" else sys.stderr
        for text in lines:
            print(self.line(rank, text), file=stream)
        stream.flush()

    def show(self, rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        """Republish one displayed output of replica `rank` (only inside a running IPython:
        outside one there is nowhere to show it)."""
        from IPython import get_ipython
        from IPython.display import publish_display_data

        if get_ipython() is not None:
            publish_display_data(data, metadata)

    def _new_lines(self, rank: int, part: Any, name: str, final: bool) -> list[str]:
        text = stream_text(part, name)
        key = (rank, name)
        new = text[self._seen.get(key, 0) :]
        self._seen[key] = len(text)
        *lines, rest = (self._pending.get(key, "") + new).split("\n")
        if final and rest:
            lines.append(rest)
            rest = ""
        self._pending[key] = rest
        return lines


def stream_text(part: Any, name: str) -> str:
    """All that one engine's request printed on `name` ("stdout"/"stderr") so far."""
    try:
        text = getattr(part, name)
    except Exception:
        return ""
    if isinstance(text, list):
        text = "".join(t or "" for t in text)
    return text or ""


def display_outputs(part: Any) -> list[dict[str, Any]]:
    """The display messages (`{"data": ..., "metadata": ...}`) one engine's request sent."""
    try:
        outputs = part.outputs
    except Exception:
        return []
    if outputs and isinstance(outputs[0], list):  # a multi-engine result: one list per engine
        outputs = outputs[0]
    return list(outputs or [])


def wait_for_outputs(
    parts: list[Any], engines: Sequence[EngineInfo], timeout_s: float = OUTPUT_WAIT_S
) -> list[int]:
    """Wait, `timeout_s` at most in all, until what every answered engine printed is here.

    Returns the replicas whose output is still incomplete (their last lines may be missing).

    Note [Output after the reply]: an engine's reply and what it printed travel separately
    (the reply through the controller's scheduler, the output through its iopub relay), so the
    reply often comes first. On a loaded machine the output can follow more than a second
    later (a cell's printed lines went missing on a 2-core CI machine running tests in
    parallel, while this waited 1 s per engine and then printed what it had). The wait ends
    as soon as the output is complete, so it costs nothing when output is on time; an engine
    that died or never answered is not waited for (ipyparallel completes a dead engine's
    output itself).

    Example:
        >>> wait_for_outputs([], [])
        []
    """
    deadline = time.monotonic() + timeout_s
    late = []
    for info, part in zip(engines, parts):
        if not part.ready():
            continue
        try:
            complete = part.wait_for_output(max(0.0, deadline - time.monotonic()))
        except Exception:  # a result that cannot say: nothing more will come for it
            complete = True
        if not complete:
            late.append(info.rank)
    return late


def say_late_output(late: list[int]) -> None:
    """One line on stderr naming the replicas whose output did not arrive in time."""
    if late:
        print(
            f"[nbdist] the output of replica(s) {late} was still arriving "
            f"{OUTPUT_WAIT_S:g} s after their results; lines they printed last may be missing.",
            file=sys.stderr,
        )
