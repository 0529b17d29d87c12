"""A static picture of a training run: loss per step, accuracy per epoch, collective timing.

Reads what a strategy recorded (`strategy.extended.telemetry`) and what the training loop
measured, and draws it with matplotlib's object API (no pyplot state). `nbdist demo` saves it;
the live ipywidgets dashboard (a later issue) will reuse the summaries. Front-end layer.

Example:
    >>> from nbdist.telemetry.records import Telemetry
    >>> summarize_telemetry(Telemetry().records())["collectives"]
    0
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nbdist.core.units import format_bytes
from nbdist.telemetry.records import CollectiveRecord

__all__ = ["plot_dashboard", "summarize_telemetry", "telemetry_line"]


def summarize_telemetry(records: Sequence[CollectiveRecord]) -> dict[str, Any]:
    """What the collectives did, in numbers: per op and per replica.

    Returns:
        `{"collectives": n, "ops": {op: {"count", "nbytes", "implementation", "median_ms",
        "p90_ms", "max_ms", "total_s"}}, "replicas": {replica_id: {"mean_wait_ms",
        "total_wait_s", "last_to_arrive"}}}`; `last_to_arrive` counts the collectives that
        replica was the last to reach (the others waited for it).

    Example:
        >>> from nbdist.telemetry.records import Telemetry
        >>> t = Telemetry()
        >>> t.record("gradient_sync", 8, "local", (0, 1), 0.0, 0.002, (0.001, 0.0))
        >>> summarize_telemetry(t.records())["replicas"][1]["last_to_arrive"]
        1
    """
    ops: dict[str, list[CollectiveRecord]] = collections.defaultdict(list)
    waits: dict[int, list[float]] = collections.defaultdict(list)
    last: collections.Counter[int] = collections.Counter()
    for record in records:
        ops[record.op].append(record)
        for replica, wait in zip(record.replicas, record.waits):
            waits[replica].append(wait)
        if len(record.waits) > 1:
            last[record.replicas[min(range(len(record.waits)), key=record.waits.__getitem__)]] += 1
    by_op = {}
    for op, group in ops.items():
        durations = sorted(r.duration for r in group)
        by_op[op] = {
            "count": len(group),
            "nbytes": group[-1].nbytes,
            "implementation": ", ".join(sorted({r.implementation for r in group})),
            "median_ms": statistics.median(durations) * 1e3,
            "p90_ms": durations[int(0.9 * (len(durations) - 1))] * 1e3,
            "max_ms": durations[-1] * 1e3,
            "total_s": sum(durations),
        }
    by_replica = {
        replica: {
            "mean_wait_ms": statistics.fmean(values) * 1e3,
            "total_wait_s": sum(values),
            "last_to_arrive": last[replica],
        }
        for replica, values in sorted(waits.items())
    }
    return {"collectives": len(records), "ops": by_op, "replicas": by_replica}


def telemetry_line(summary: dict[str, Any]) -> str:
    """One line about the collectives (empty when there were none, e.g. one replica)."""
    if not summary["collectives"]:
        return ""
    parts = [
        f"{op}: {s['count']} × {format_bytes(s['nbytes'])}, median {s['median_ms']:.2f} ms"
        for op, s in summary["ops"].items()
    ]
    replicas = summary["replicas"]
    if len(replicas) <= 4:
        waited = ", ".join(f"replica {r} {s['mean_wait_ms']:.2f} ms" for r, s in replicas.items())
    else:
        least = min(replicas, key=lambda r: replicas[r]["mean_wait_ms"])
        most = max(replicas, key=lambda r: replicas[r]["mean_wait_ms"])
        waited = (
            f"from {replicas[least]['mean_wait_ms']:.2f} ms (replica {least}) to "
            f"{replicas[most]['mean_wait_ms']:.2f} ms (replica {most})"
        )
    return "collectives: " + "; ".join(parts) + f"; mean wait per collective: {waited}"


# -- the picture ----------------------------------------------------------------------------
def plot_dashboard(
    step_losses: Sequence[float],
    epoch_accuracies: Sequence[float],
    records: Sequence[CollectiveRecord],
    path: str | Path,
    *,
    title: str = "nbdist training",
    start: float | None = None,
    steps_per_epoch: int | None = None,
) -> Path:
    """Save a three-panel picture of a training run and return its path.

    Panels: training loss per step (averaged over the global batch, all replicas), test
    accuracy per epoch, and each collective's duration with the time every replica waited in
    it for the others (the replica that waits least is the one the others waited for).
    Drawn on a `matplotlib.figure.Figure` with the Agg canvas, so no window opens and the
    user's pyplot state is untouched. The folder of `path` is created if needed.

    Args:
        step_losses: Mean training loss of each step.
        epoch_accuracies: Test accuracy (0-1) after each epoch.
        records: `strategy.extended.telemetry.records()`.
        path: Where to write; the extension chooses the format (`.png`, `.svg`, `.pdf`).
        title: The figure's title.
        start: `time.perf_counter()` when training began (the timeline's zero); default the
            first record's start.
        steps_per_epoch: Draws epoch boundaries on the loss panel when given.
    """
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(12, 8.5), dpi=100, layout="constrained")
    fig.suptitle(title, fontsize=13, fontweight="bold")
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 1.1))
    _plot_loss(fig.add_subplot(grid[0, 0]), step_losses, steps_per_epoch)
    _plot_accuracy(fig.add_subplot(grid[0, 1]), epoch_accuracies)
    _plot_collectives(fig.add_subplot(grid[1, :]), records, start)
    fig.savefig(path)
    return path


def _plot_loss(ax: Any, step_losses: Sequence[float], steps_per_epoch: int | None) -> None:
    from matplotlib import ticker

    steps = range(1, len(step_losses) + 1)
    ax.plot(steps, step_losses, color="tab:blue", linewidth=1.2, label="loss of each step")
    if steps_per_epoch and len(step_losses) >= 2 * steps_per_epoch:
        for boundary in range(steps_per_epoch, len(step_losses), steps_per_epoch):
            ax.axvline(boundary + 0.5, color="0.85", linewidth=0.8, zorder=0)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    # Plain numbers (0.5, not 5×10⁻¹); minor ticks labelled at 2× and 5× a power of ten.
    ax.yaxis.set_minor_formatter(
        ticker.FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "25" else "")
    )
    ax.set_title("Training loss per step (global batch, reduced over replicas)")
    ax.set_xlabel("step" + (f"  ({steps_per_epoch} steps per epoch)" if steps_per_epoch else ""))
    ax.set_ylabel("cross-entropy (log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _plot_accuracy(ax: Any, epoch_accuracies: Sequence[float]) -> None:
    epochs = range(1, len(epoch_accuracies) + 1)
    percent = [100 * a for a in epoch_accuracies]
    ax.plot(epochs, percent, marker="o", color="tab:green", linewidth=1.5)
    if percent:
        ax.annotate(
            f"{percent[-1]:.1f}%", (len(percent), percent[-1]), textcoords="offset points",
            xytext=(-8, 6), ha="right", fontsize=10, fontweight="bold", color="tab:green",
        )  # fmt: skip
    low = min(percent, default=0.0)
    ax.set_ylim(max(0.0, min(low - 5, 80.0)), 102)
    ax.set_xlim(0.5, max(len(percent), 1) + 0.5)
    ax.set_xticks(list(epochs))
    ax.set_title("Test accuracy after each epoch")
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy (%)")
    ax.grid(True, alpha=0.3)


def _plot_collectives(ax: Any, records: Sequence[CollectiveRecord], start: float | None) -> None:
    ax.set_title("Collectives: duration and time each replica waited for the others")
    ax.set_xlabel("time since training started (s)")
    ax.set_ylabel("milliseconds (symlog scale)")
    if not records:
        ax.text(
            0.5, 0.5, "no collectives: a single replica does not communicate",
            ha="center", va="center", transform=ax.transAxes, fontsize=11, color="0.4",
        )  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        return
    origin = records[0].start if start is None else start
    summary = summarize_telemetry(records)
    replica_ids = sorted(summary["replicas"])
    colors = _replica_colors(len(replica_ids))
    markers = dict(zip(summary["ops"], "o^sDvP*X"))
    times = [r.start - origin for r in records]
    ax.plot(
        times, [r.duration * 1e3 for r in records], color="0.25", linewidth=0.9,
        label="duration of the collective", zorder=3,
    )  # fmt: skip
    for index, replica in enumerate(replica_ids):
        stats = summary["replicas"][replica]
        for op, marker in markers.items():
            points = [
                (t, r.waits[r.replicas.index(replica)] * 1e3)
                for t, r in zip(times, records)
                if r.op == op and replica in r.replicas
            ]
            if not points:
                continue
            first_op = op == next(iter(markers))
            if not first_op:
                label = None
            elif len(replica_ids) <= 8:
                label = (
                    f"replica {replica} waited (mean {stats['mean_wait_ms']:.2f} ms; the others "
                    f"waited for it {stats['last_to_arrive']}×)"
                )
            else:  # one legend entry for them all
                label = f"time each replica waited (one colour each, {len(replica_ids)} replicas)"
                label = label if index == 0 else None
            ax.scatter(
                *zip(*points), s=14, marker=marker, color=colors[index], alpha=0.75,
                linewidths=0, label=label, zorder=4,
            )  # fmt: skip
    # Symlog: the last replica to arrive waits 0, which a log axis cannot show. The linear
    # part spans up to the smallest power of ten that most non-zero waits exceed.
    values = [w * 1e3 for r in records for w in (*r.waits, r.duration)]
    positive = sorted(v for v in values if v > 0)
    floor = positive[len(positive) // 10] if positive else 1.0
    ax.set_yscale("symlog", linthresh=10 ** math.floor(math.log10(floor)), linscale=0.5)
    ax.set_ylim(0, max(values, default=1.0) * 10)
    ax.grid(True, alpha=0.3)
    ops_text = "\n".join(
        f"{op} ({markers[op]}): {s['count']} × {format_bytes(s['nbytes'])} "
        f"via {s['implementation']}, "
        f"median {s['median_ms']:.2f} ms, p90 {s['p90_ms']:.2f} ms"
        for op, s in summary["ops"].items()
    )
    ax.text(
        0.01, 0.97, ops_text, transform=ax.transAxes, va="top", ha="left", fontsize=9,
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.8", "alpha": 0.9},
        zorder=5,
    )  # fmt: skip
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9)


def _replica_colors(count: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(count)]
