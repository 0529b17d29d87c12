"""The training view: every `nd.log` metric as one curve per replica, steps per second, and a
flag when the replicas' parameters diverge.

The flag comes from the replica check (Note [Replica check] in
`nbdist.strategies._replica_check`), which compares the parameters themselves: per-replica
losses differ whenever the replicas see different data, and equal losses prove nothing about
the parameters, so the curves are never used for it."""

from __future__ import annotations

from typing import Any

import ipywidgets
import numpy as np

from nbdist.telemetry.metrics import MetricRecord
from nbdist.widgets._canvas import Blitter, coarse, new_figure, nice
from nbdist.widgets._data import DashboardData

__all__ = ["TrainingPanels", "TrainingView", "curves", "draw_training"]


def curves(metrics: list[MetricRecord]) -> dict[str, dict[int, tuple[list, list]]]:
    """`{name: {replica: (steps, values)}}` from metric records."""
    out: dict[str, dict[int, tuple[list, list]]] = {}
    for m in metrics:
        xs, ys = out.setdefault(m.name, {}).setdefault(m.replica, ([], []))
        xs.append(m.step)
        ys.append(m.value)
    return out


def diverged(data: DashboardData) -> bool:
    """True when the newest replica check found the replicas' parameters different.

    Example:
        >>> from nbdist.telemetry.records import ReplicaCheck
        >>> diverged(DashboardData(replica_check=ReplicaCheck(1.0, False, "differ")))
        True
        >>> diverged(DashboardData())
        False
    """
    check = data.replica_check
    return check is not None and not check.identical


def steps_per_second(metrics: list[MetricRecord], window: int = 2_000) -> float:
    """Logged steps per second of wall time over the newest `window` records (0 with fewer
    than 2)."""
    metrics = metrics[-window:]
    if len(metrics) < 2:
        return 0.0
    steps = {m.step for m in metrics}
    span = metrics[-1].wall - metrics[0].wall
    return (len(steps) - 1) / span if span > 0 else 0.0


class TrainingPanels:
    """One panel per metric in `fig` (a Figure or SubFigure), a line per replica, built once
    for a set of metric names and replicas and updated by `show(data)`; `png()` redraws only
    the lines and the steps/s while the axes stay the same (Note [Fast redraw] in
    `nbdist.widgets.reductions`): a full redraw cost about as much as every other view.

    Example:
        >>> panels = TrainingPanels(new_figure(9, 3.5))
        >>> panels.show(DashboardData())
        {}
        >>> panels.png()[:4]
        b'\x89PNG'
    """

    def __init__(self, fig: Any):
        self.fig = fig
        self.layout: Any = None
        self.lines: dict[tuple[str, int], Any] = {}
        self.axes: dict[str, Any] = {}
        self.rate = fig.text(0.97, 0.98, "", ha="right", va="top", fontsize=9)
        self._flag = False
        self._notes: list[Any] = []  # texts `_build` added (the divergence note)
        self._blit = Blitter(fig)

    def _build(self, by_name: dict[str, dict[int, tuple[list, list]]], flag: bool) -> None:
        """Axes, titles, legends and the divergence note for these metrics and replicas."""
        for ax in list(self.fig.axes):
            ax.remove()
        for text in self._notes:
            text.remove()
        self._notes = []
        self.lines, self.axes = {}, {}
        self._blit = Blitter(self.fig)
        self.layout, self._flag = (sorted((n, tuple(sorted(r))) for n, r in by_name.items()), flag)
        mark = "  ⚠ replicas diverge" if flag else ""
        if flag:
            self._notes.append(self.fig.text(
                0.03, 0.98, "⚠ replicas diverge: their parameters differ (ReplicasDivergedError)",
                ha="left", va="top", fontsize=9, color="#e63946",
            ))  # fmt: skip
        if not by_name:
            ax = self.fig.subplots()
            ax.axis("off")
            ax.text(0.5, 0.5, "no metrics yet: call nd.log(loss=...) in the training loop",
                    ha="center", va="center")  # fmt: skip
            return
        # Room above the panels for the steps/s line and below for the x labels, so the
        # panel titles never run into either (`fig` may be the picture's subfigure).
        axes = self.fig.subplots(
            1, len(by_name), squeeze=False,
            gridspec_kw={"top": 0.8, "bottom": 0.17, "left": 0.08, "right": 0.97, "wspace": 0.25},
        )[0]  # fmt: skip
        for ax, (name, per_replica) in zip(axes, sorted(by_name.items())):
            self.axes[name] = ax
            for replica in sorted(per_replica):
                (self.lines[name, replica],) = ax.plot([], [], label=f"replica {replica}", lw=1)
            ax.set_title(f"{name}{mark}", fontsize=9, color="#e63946" if flag else "black")
            ax.set_xlabel("step")
            ax.legend(fontsize=7, loc="upper right")

    def show(self, data: DashboardData) -> dict[str, dict[int, tuple[list, list]]]:
        """Put `data`'s metrics into the panels (draws nothing by itself); returns the curves."""
        by_name = curves(data.metrics)
        flag = diverged(data)
        layout = sorted((n, tuple(sorted(r))) for n, r in by_name.items())
        if (layout, flag) != (self.layout, self._flag):
            self._build(by_name, flag)
        for name, per_replica in by_name.items():
            ax = self.axes[name]
            xs_all, ys_all = [], []
            for replica, (xs, ys) in per_replica.items():
                self.lines[name, replica].set_data(xs, ys)
                xs_all.append(max(xs))
                ys_all += [min(ys), max(ys)]
            low, high = min(ys_all), max(ys_all)
            grid = nice((high - low) or abs(high) or 1.0) / 5
            ax.set_xlim(0.0, coarse(max(xs_all)))
            ax.set_ylim(*self._blit.steady(
                f"{name}.y", np.floor(low / grid) * grid, np.ceil(high / grid) * grid + grid / 4
            ))  # fmt: skip
        self.rate.set_text(f"{steps_per_second(data.metrics):.1f} steps/s")
        return by_name

    def png(self) -> bytes:
        """The panels as PNG, redrawing only the lines and steps/s while the frame stays."""
        frame = (self.layout, self._flag,
                 [ax.get_xlim() + ax.get_ylim() for ax in self.axes.values()])  # fmt: skip
        return self._blit.png(frame, [*self.lines.values(), self.rate])


def draw_training(fig: Any, data: DashboardData) -> None:
    """Draw one panel per metric into `fig` (a Figure or SubFigure)."""
    TrainingPanels(fig).show(data)


class TrainingView:
    """The training view as an `ipywidgets.Image` redrawn only when metrics changed."""

    title = "Training"

    def __init__(self) -> None:
        self.widget = ipywidgets.Image(format="png")
        self.key: Any = None
        self.curves: dict[str, dict[int, tuple[list, list]]] = {}
        self._panels: TrainingPanels | None = None

    def update(self, data: DashboardData) -> bool:
        metrics = data.metrics
        key = (len(metrics), metrics[-1].wall if metrics else None, data.replica_check)
        if key == self.key:
            return False
        self.key = key
        if self._panels is None:
            self._panels = TrainingPanels(new_figure(9, 3.5))
        self.curves = self._panels.show(data)
        self.widget.value = self._panels.png()
        return True
