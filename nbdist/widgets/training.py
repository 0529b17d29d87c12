"""The training view: every `nd.log` metric as one curve per replica, steps per second, and a
flag when the replicas' parameters diverge.

The flag comes from the replica check (Note [Replica check] in
`nbdist.strategies._replica_check`), which compares the parameters themselves: per-replica
losses differ whenever the replicas see different data, and equal losses prove nothing about
the parameters, so the curves are never used for it."""

from __future__ import annotations

from typing import Any

import ipywidgets

from nbdist.metrics import MetricRecord
from nbdist.widgets._canvas import new_figure, png_bytes
from nbdist.widgets._data import DashboardData

__all__ = ["TrainingView", "curves", "draw_training"]


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
        >>> from nbdist.telemetry import ReplicaCheck
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


def draw_training(fig: Any, data: DashboardData) -> None:
    """Draw one panel per metric into `fig`."""
    by_name = curves(data.metrics)
    flag = "  ⚠ replicas diverge" if diverged(data) else ""
    if flag:
        fig.text(0.03, 0.98, "⚠ replicas diverge: their parameters differ (ReplicasDivergedError)",
                 ha="left", va="top", fontsize=9, color="#e63946")  # fmt: skip
    if not by_name:
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "no metrics yet: call nd.log(loss=...) in the training loop",
                ha="center", va="center")  # fmt: skip
        return
    # Room above the panels for the steps/s line and below for the x labels, so the panel
    # titles never run into either (`fig` may be the dashboard picture's subfigure).
    axes = fig.subplots(
        1, len(by_name), squeeze=False,
        gridspec_kw={"top": 0.8, "bottom": 0.17, "left": 0.08, "right": 0.97, "wspace": 0.25},
    )[0]  # fmt: skip
    for ax, (name, per_replica) in zip(axes, sorted(by_name.items())):
        for replica, (xs, ys) in sorted(per_replica.items()):
            ax.plot(xs, ys, label=f"replica {replica}", linewidth=1)
        ax.set_title(f"{name}{flag}", fontsize=9, color="#e63946" if flag else "black")
        ax.set_xlabel("step")
        ax.legend(fontsize=7, loc="upper right")
    fig.text(0.97, 0.98, f"{steps_per_second(data.metrics):.1f} steps/s", ha="right",
             va="top", fontsize=9)  # fmt: skip


class TrainingView:
    """The training view as an `ipywidgets.Image` redrawn only when metrics changed."""

    title = "Training"

    def __init__(self) -> None:
        self.widget = ipywidgets.Image(format="png")
        self.key: Any = None
        self.curves: dict[str, dict[int, tuple[list, list]]] = {}

    def update(self, data: DashboardData) -> bool:
        metrics = data.metrics
        key = (len(metrics), metrics[-1].wall if metrics else None, data.replica_check)
        if key == self.key:
            return False
        self.key = key
        self.curves = curves(metrics)
        fig = new_figure(9, 3.5)
        draw_training(fig, data)
        self.widget.value = png_bytes(fig)
        return True
