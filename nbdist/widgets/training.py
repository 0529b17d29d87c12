"""The training view: every `nd.log` metric as one curve per replica, steps per second, and a
flag when the replicas' values diverge."""

from __future__ import annotations

import math
from typing import Any

import ipywidgets

from nbdist.widgets._canvas import new_figure, png_bytes

__all__ = ["TrainingView", "curves", "draw_training"]

_DIVERGE = 0.05  # relative spread of the replicas' recent means that is flagged
_RECENT = 10  # values per replica averaged before comparing (one noisy step flags nothing)


def curves(metrics: list[tuple]) -> dict[str, dict[int, tuple[list, list]]]:
    """`{name: {replica: (steps, values)}}` from metric records."""
    out: dict[str, dict[int, tuple[list, list]]] = {}
    for replica, step, name, value, _ in metrics:
        xs, ys = out.setdefault(name, {}).setdefault(replica, ([], []))
        xs.append(step)
        ys.append(value)
    return out


def _diverged(per_replica: dict[int, tuple[list, list]]) -> bool:
    last = [sum(ys[-_RECENT:]) / len(ys[-_RECENT:]) for _, ys in per_replica.values() if ys]
    if len(last) < 2 or not all(math.isfinite(v) for v in last):
        return False
    scale = max(abs(v) for v in last) or 1.0
    return (max(last) - min(last)) / scale > _DIVERGE


def steps_per_second(metrics: list[tuple]) -> float:
    """Logged steps per second of wall time over the records kept (0 with fewer than 2)."""
    if len(metrics) < 2:
        return 0.0
    steps = {m[1] for m in metrics}
    span = metrics[-1][4] - metrics[0][4]
    return (len(steps) - 1) / span if span > 0 else 0.0


def draw_training(fig: Any, data: dict) -> None:
    """Draw one panel per metric into `fig`."""
    by_name = curves(data["metrics"])
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
        flag = "  ⚠ replicas diverge" if _diverged(per_replica) else ""
        ax.set_title(f"{name}{flag}", fontsize=9, color="#e63946" if flag else "black")
        ax.set_xlabel("step")
        ax.legend(fontsize=7, loc="upper right")
    fig.text(0.97, 0.98, f"{steps_per_second(data['metrics']):.1f} steps/s", ha="right",
             va="top", fontsize=9)  # fmt: skip


class TrainingView:
    """The training view as an `ipywidgets.Image` redrawn only when metrics changed."""

    title = "Training"

    def __init__(self) -> None:
        self.widget = ipywidgets.Image(format="png")
        self.key: Any = None
        self.curves: dict[str, dict[int, tuple[list, list]]] = {}

    def update(self, data: dict) -> bool:
        metrics = data["metrics"]
        key = (len(metrics), metrics[-1][4] if metrics else None)
        if key == self.key:
            return False
        self.key = key
        self.curves = curves(metrics)
        fig = new_figure(9, 3.5)
        draw_training(fig, data)
        self.widget.value = png_bytes(fig)
        return True
