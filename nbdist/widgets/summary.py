"""The dashboard's live summary: one line above the tabs that changes while training runs
(step, loss, steps per second, the last all-reduce, the replica check), so a newcomer who
clicks nothing still sees training move.

The loss is the newest value each replica logged under `loss` (else under the first name
logged), averaged over the replicas: each replica trains on its own batches, so their losses
differ and none of them is "the" loss. Divergence is said only from the replica check (Note
[Replica check]), which compares the parameters themselves.
"""

from __future__ import annotations

import html
import time

from nbdist.widgets._data import DashboardData
from nbdist.widgets.training import steps_per_second

__all__ = ["summary_html", "summary_text"]

_NEWEST = 200  # metric records searched for each replica's newest value


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _parts(data: DashboardData) -> list[tuple[str, str]]:
    """`(css class, text)` per part of the line."""
    parts: list[tuple[str, str]] = []
    recent = data.metrics[-_NEWEST:]
    if recent:
        names = {m.name for m in recent}
        name = "loss" if "loss" in names else sorted(names)[0]
        newest = {m.replica: m for m in recent if m.name == name}
        step = max(m.step for m in newest.values())
        mean = sum(m.value for m in newest.values()) / len(newest)
        over = f" (mean of {len(newest)} replicas)" if len(newest) > 1 else ""
        parts += [("nd-step", f"step {step}"), ("nd-loss", f"{name} {mean:.4g}{over}"),
                  ("nd-rate", f"{steps_per_second(data.metrics):.1f} steps/s")]  # fmt: skip
    else:
        parts.append(("nd-step", "no metrics yet: nd.log(loss=...) in the loop draws curves"))
    reduce = next((r for r in reversed(data.collectives[-50:])
                   if r.op.startswith("all_reduce")), None)  # fmt: skip
    if reduce is not None:
        parts.append(
            ("nd-allreduce",
             f"last all-reduce {reduce.duration * 1e3:.2f} ms ({_size(reduce.nbytes)})")
        )  # fmt: skip
    check = data.replica_check
    if check is not None:
        when = time.strftime("%H:%M:%S", time.localtime(check.at))
        if check.identical:
            parts.append(("nd-check", f"replicas identical (checked {when})"))
        else:
            parts.append(("nd-check nd-diverged", f"⚠ replicas diverge (checked {when})"))
    return parts


def summary_text(data: DashboardData) -> str:
    """The summary as plain text.

    Example:
        >>> from nbdist.telemetry.metrics import MetricRecord
        >>> metrics = [MetricRecord(r, s, "loss", 1.0 + r, 100.0 + s) for s in (0, 1)
        ...            for r in (0, 1)]
        >>> summary_text(DashboardData(metrics=metrics))
        'step 1 · loss 1.5 (mean of 2 replicas) · 1.0 steps/s'
    """
    return " · ".join(text for _, text in _parts(data))


def summary_html(data: DashboardData) -> str:
    """The summary as the widget's HTML (a failed replica check in red)."""
    spans = []
    for css, text in _parts(data):
        style = " style='color:#e63946;font-weight:bold'" if "nd-diverged" in css else ""
        spans.append(f"<span class='{css}'{style}>{html.escape(text)}</span>")
    return "<div class='nd-summary-line'>" + " · ".join(spans) + "</div>"
