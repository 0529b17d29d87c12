"""An Agg figure rendered to PNG bytes (thread-safe: no pyplot state), and `Blitter`: a
figure whose frame (axes, ticks, labels, legends) is drawn once and whose data is drawn on a
copy of it while the frame stays the same (Note [Fast redraw] in `nbdist.widgets.reductions`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import PIL.Image
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["Blitter", "coarse", "new_figure", "nice", "png_bytes"]

_ROUND = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def new_figure(width: float, height: float, dpi: int = 80) -> Figure:
    """A Figure with its own Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=dpi)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.92, hspace=0.45, wspace=0.3)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure, compress_level: int = 1) -> bytes:
    """The figure as PNG. Level 1 (the default, for live views) encodes several times faster
    than zlib's default 6 for a few percent more bytes; `save` uses 6."""
    buffer = io.BytesIO()
    fig.canvas.print_png(buffer, pil_kwargs={"compress_level": compress_level})
    return buffer.getvalue()


def nice(value: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten)
    at least `value` (1 for nothing): limits that stay put while the data grows a little, so
    the frame is drawn once.

    Example:
        >>> nice(0.0), nice(3.3), nice(170.0)
        (1.0, 4.0, 200.0)
    """
    if not value > 0:
        return 1.0
    power = 10.0 ** np.floor(np.log10(value))
    return float(next(m * power for m in _ROUND if m * power >= value * (1 - 1e-9)))


def coarse(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten at least 1.25 times `value`: limits for
    a count that keeps growing (steps), changed (and the frame drawn anew) only every 2 to 2.5
    times growth.

    Example:
        >>> coarse(0.0), coarse(7.0), coarse(90.0)
        (1.0, 10.0, 200.0)
    """
    if not value > 0:
        return 1.0
    target = value * 1.25
    power = 10.0 ** np.floor(np.log10(target))
    return float(next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= target * (1 - 1e-9)))


class Blitter:
    """Draws `fig` as PNG: the whole figure when the frame changed, else only the data
    artists on a copy of the frame drawn last time (matplotlib's blitting).

    Example:
        >>> fig = new_figure(2, 2)
        >>> ax = fig.subplots()
        >>> (line,) = ax.plot([0, 1], [0, 1])
        >>> blit = Blitter(fig)
        >>> blit.png(frame=(ax.get_xlim(),), dynamic=[line])[:4]
        b'\\x89PNG'
    """

    def __init__(self, fig: Figure):
        self.fig = fig
        self._frame: Any = None
        self._background: Any = None
        self._limits: dict[str, tuple[float, float]] = {}
        self.frames_drawn = 0
        """How many times the whole figure was drawn (the rest were blits)."""

    def steady(self, name: str, low: float, high: float) -> tuple[float, float]:
        """Limits `(low, high)`, or the last ones of `name` while the data still fits them
        and fills more than a fifth of their span (of their decades on a log axis), so that
        the frame stays put when the data wobbles."""
        last = self._limits.get(name)
        if last is not None and last[0] <= low and high <= last[1]:
            log = low > 0 and last[0] > 0
            span = (lambda a, b: np.log10(b / a)) if log else (lambda a, b: b - a)
            if span(low, high) > 0.2 * span(*last):
                return last
        self._limits[name] = (low, high)
        return low, high

    def png(self, frame: Any, dynamic: Sequence[Any], compress_level: int = 1) -> bytes:
        """The figure as PNG; `frame` is anything that changes when the frame must be drawn
        anew (limits, labels, legends), `dynamic` the artists drawn on top every time."""
        canvas = self.fig.canvas
        frame = (frame, canvas.get_width_height())
        if frame != self._frame:
            for artist in dynamic:
                artist.set_animated(True)  # left out of canvas.draw(), drawn below
            canvas.draw()
            self._background = canvas.copy_from_bbox(self.fig.bbox)
            self._frame = frame
            self.frames_drawn += 1
        else:
            canvas.restore_region(self._background)
        for artist in dynamic:
            self.fig.draw_artist(artist)
        width, height = canvas.get_width_height()
        image = PIL.Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw",
                                     "RGBA", 0, 1)  # fmt: skip
        buffer = io.BytesIO()
        image.save(buffer, format="png", compress_level=compress_level)
        return buffer.getvalue()
