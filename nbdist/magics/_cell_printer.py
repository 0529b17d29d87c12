"""`CellPrinter`: how a `%%distribute` cell shows the engines' output in the notebook.

The one output printer of every engine call (`nbdist.cluster.output.OutputPrinter`: `[N] line`,
live), plus the first target's `nd.progress` bars. A module of its own so that both the cell
(`magics._cell`) and the tabs view built on it (`magics._tabs`) import it without a cycle.

Example (needs engines, so not run here)::

    printer = CellPrinter("all")   # then supervise(..., printer=printer)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nbdist.cluster.output import OutputPrinter, say_late_output, wait_for_outputs
from nbdist.magics._progress import CellBars

if TYPE_CHECKING:
    from nbdist.cluster.status import EngineInfo

__all__ = ["CellPrinter"]


class CellPrinter(OutputPrinter):
    """The cell's output printer: `[N] line` as every call's (`OutputPrinter`), plus the first
    target's `nd.progress` bars, drawn in every mode (lines are printed around them)."""

    def start(self, engines: Sequence[EngineInfo], parts: list[Any]) -> None:
        super().start(engines, parts)
        self.bars = CellBars(parts[0])

    def poll(self, final: bool = False) -> None:
        super().poll(final)
        if not final:
            self.bars.poll()

    def write_lines(self, rank: int, stream_name: str, lines: list[str]) -> None:
        import sys

        with self.bars.writing(sys.stdout if stream_name == "stdout" else sys.stderr):
            super().write_lines(rank, stream_name, lines)

    def finish(self) -> None:
        """The rest of the output (Note [Output after the reply] in `nbdist.cluster.output`),
        and the bars' last states (they come with the first target's output)."""
        shown = self.shown() or [0]
        late = wait_for_outputs([self.parts[i] for i in shown], [self.engines[i] for i in shown])
        self.poll(final=True)
        self.bars.finish()
        if self.mode != "none":
            say_late_output(late)
