"""The reductions view: a timeline of collectives per replica, who waited for whom (the
straggler by name), bandwidth against message size, and compute vs communication per step."""

from __future__ import annotations

from typing import Any

import ipywidgets

from nbdist.timeline import blame, step_split, straggler
from nbdist.widgets._canvas import new_figure, png_bytes

__all__ = ["ReductionsView", "draw_reductions"]

_TIMELINE = 200  # newest collectives drawn on the timeline
_WINDOW = 500  # collectives the blame is computed over
_SCATTER = 1_000  # newest collectives on the bandwidth chart


def draw_reductions(fig: Any, data: dict) -> None:
    """Draw the four reduction panels into `fig` (a Figure or SubFigure)."""
    records = data["collectives"]
    axes = fig.subplots(2, 2)
    timeline, waits, bandwidth, steps = axes.ravel()
    recent = records[-_TIMELINE:]
    t0 = recent[0][4] if recent else 0.0
    replicas = sorted({r for rec in records for r in rec[3]})
    for replica in replicas:
        waiting, working = [], []
        for _, _, _, reps, start, duration, w in recent:
            if replica in reps:
                wait = w[reps.index(replica)]
                arrival = start + (max(w) - wait if len(w) > 1 else 0.0) - t0
                waiting.append((arrival, wait))
                working.append((arrival + wait, max(duration - (arrival + t0 - start) - wait, 0)))
        timeline.broken_barh(waiting, (replica - 0.4, 0.8), color="#f4a261")
        timeline.broken_barh(working, (replica - 0.4, 0.8), color="#2a6f97")
    timeline.set_yticks(replicas, [f"replica {r}" for r in replicas])
    timeline.set_xlabel("seconds (orange: waiting for others)")
    timeline.set_title(f"last {len(recent)} collectives", fontsize=9)
    totals = blame(records, _WINDOW)
    late = straggler(records, _WINDOW)
    names = [str(r) for r in totals]
    colors = ["#e63946" if r == late else "#8d99ae" for r in totals]
    waits.bar(names, [v * 1e3 for v in totals.values()], color=colors)
    waits.set_xlabel("replica")
    waits.set_ylabel("others waited for it (ms)")
    waits.set_title(
        f"straggler: replica {late}" if late is not None else "no straggler", fontsize=9
    )
    by_op: dict[str, tuple[list, list]] = {}
    for op, nbytes, _, _, _, duration, _ in records[-_SCATTER:]:
        if duration > 0 and nbytes > 0:
            xs, ys = by_op.setdefault(op, ([], []))
            xs.append(nbytes)
            ys.append(nbytes / duration / 1e6)
    for op, (xs, ys) in by_op.items():
        bandwidth.scatter(xs, ys, s=6, label=op)
    if by_op:
        bandwidth.set_xscale("log")
        bandwidth.set_yscale("log")
        bandwidth.legend(fontsize=7, loc="upper left")
    bandwidth.set_xlabel("message bytes")
    bandwidth.set_ylabel("MB/s")
    split = step_split(data["steps"][-_TIMELINE:], records[-4 * _TIMELINE :])
    xs = range(len(split))
    comm = [c * 1e3 for _, _, c in split]
    compute = [(d - c) * 1e3 for _, d, c in split]
    if split:
        steps.stackplot(list(xs), compute, comm, colors=["#2a9d8f", "#f4a261"],
                        labels=["compute", "communication"])  # fmt: skip
    steps.set_xlabel("step")
    steps.set_ylabel("ms")
    if split:
        steps.legend(fontsize=7, loc="upper right")


class ReductionsView:
    """The reductions view as an `ipywidgets.Image` redrawn only when records changed."""

    title = "Reductions"

    def __init__(self) -> None:
        self.image = ipywidgets.Image(format="png")
        self.caption = ipywidgets.HTML()
        self.caption.add_class("nd-reductions-caption")
        self.widget = ipywidgets.VBox([self.caption, self.image])
        self.key: Any = None
        self.straggler: int | None = None
        self.count = 0

    def update(self, data: dict) -> bool:
        records = data["collectives"]
        key = (len(records), records[-1][4] if records else None, len(data["steps"]))
        if key == self.key:
            return False
        self.key = key
        self.count = len(records)
        self.straggler = straggler(records, _WINDOW)
        fig = new_figure(9, 5.5)
        draw_reductions(fig, data)
        self.image.value = png_bytes(fig)
        late = f"replica {self.straggler}" if self.straggler is not None else "none"
        self.caption.value = (
            f"<span class='nd-count'>{self.count}</span> collectives · straggler: {late}"
        )
        return True
