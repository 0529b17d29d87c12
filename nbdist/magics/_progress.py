"""The notebook's half of `nd.progress` in a `%%distribute` cell: the engines' bars, drawn here.

Each engine's `nd.progress` sends its bar's state with the request it is running
(`nbdist.cluster.engine_side.progress`); ipyparallel's client files it under that request's
`.data`. `CellBars.poll` reads the first target replica's states (the others' iterations are
not counted) and draws one `tqdm.auto` bar per engine loop, in order: tqdm's widget in
JupyterLab or Notebook 7, a text bar on stderr in a terminal. A bar's elapsed time is the
engine's. When the cell ends, `finish` draws the last states (closed bars at their final count,
bars of a loop left early shown as tqdm shows them) and closes every bar.

Example (needs engines)::

    bars = CellBars(part)              # part: replica 0's AsyncResult
    bars.poll()                        # while the cell runs
    bars.finish()                      # after its output is in
"""

from __future__ import annotations

import contextlib
from typing import Any

from nbdist._private_api import show_elapsed_and_rate
from nbdist.cluster.engine_side.progress import PROGRESS_KEY

__all__ = ["CellBars"]


class CellBars:
    """The bars of one engine's cell, mirrored in the notebook by `tqdm.auto`."""

    def __init__(self, part: Any):
        self.part = part
        self.bars: dict[int, Any] = {}
        self.done: set[int] = set()
        self.broken = False

    def _states(self) -> dict[int, dict[str, Any]]:
        try:
            data = self.part.data  # its metadata's data, kept once the request is done
        except Exception:  # not sent yet, or nothing published
            return {}
        if isinstance(data, list):  # a multi-engine result: one dict per engine
            data = data[0] if data else {}
        states = (data or {}).get(PROGRESS_KEY)
        return dict(states) if states else {}

    def poll(self) -> None:
        """Draw the newest state of every bar of the cell (new bars open in order).

        A bar that cannot be drawn (a front end without widgets, a closed stream) stops the
        drawing for the rest of the cell; it never fails the cell.
        """
        if self.broken:
            return
        try:
            self._draw_all()
        except Exception:
            self.broken = True

    def _draw_all(self) -> None:
        for bar_id, state in sorted(self._states().items()):
            if bar_id in self.done:
                continue
            bar = self.bars.get(bar_id)
            if bar is None:
                bar = self.bars[bar_id] = _open(state)
            _draw(bar, state)
            if state.get("closed"):
                self._close(bar_id)

    def writing(self, stream: Any) -> Any:
        """A context in which printing to `stream` does not break an open text bar."""
        if not self.bars:
            return contextlib.nullcontext()
        from tqdm.std import tqdm

        return tqdm.external_write_mode(file=stream)

    @property
    def seen(self) -> bool:
        """Whether the engine has opened any bar in this cell."""
        return bool(self.bars or self.done)

    def finish(self) -> None:
        """Draw the last states and close every bar (the cell has ended)."""
        self.poll()
        for bar_id in list(self.bars):
            self._close(bar_id)

    def _close(self, bar_id: int) -> None:
        bar = self.bars.pop(bar_id, None)
        self.done.add(bar_id)
        if bar is not None:
            with contextlib.suppress(Exception):  # a closed front end: nothing to draw on
                bar.close()


def _open(state: dict[str, Any]) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=state.get("total"),
        desc=state.get("desc") or None,
        unit=state.get("unit", "it"),
        unit_scale=state.get("unit_scale", False),
        unit_divisor=state.get("unit_divisor", 1000),
        leave=state.get("leave", True),
        mininterval=0,
    )


def _draw(bar: Any, state: dict[str, Any]) -> None:
    """Show `state` on `bar`: the engine's count, total, postfix, elapsed time and rate."""
    total = state.get("total")
    if total != bar.total:
        bar.total = total
        widget = getattr(bar, "container", None)  # tqdm.notebook's HBox: label, bar, numbers
        with contextlib.suppress(Exception):
            widget.children[1].max = total or 1
    show_elapsed_and_rate(bar, float(state.get("elapsed", 0.0)))  # the engine's, count / elapsed
    bar.postfix = state.get("postfix") or None
    bar.n = bar.last_print_n = state.get("n", 0)
    bar.refresh()
