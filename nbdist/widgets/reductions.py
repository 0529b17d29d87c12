"""The reductions view: a timeline of collectives per replica, who waited for whom (the
straggler by name), time against message size (a bandwidth only for messages of at least
`BANDWIDTH_MIN_BYTES`; smaller ones are latency-bound), compute vs communication per step, every
record counted per op, and a collective stuck for more than `STUCK_S` seconds shown in red with
the replicas that have arrived and those that have not.

Redraws are cheap (Note [Fast redraw]): the view keeps one Figure and its artists and only
hands them new numbers; nothing here loops in Python over more than the few hundred newest
records, except one pass that counts every record per op.
"""

from __future__ import annotations

import collections
import html
import operator
import re
import time
from typing import Any

import ipywidgets
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.patches import Patch
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, MaxNLocator

from nbdist.telemetry.records import CollectiveRecord
from nbdist.telemetry.timeline import STUCK_S, blame, slow_links, step_split, straggler, stuck
from nbdist.widgets._canvas import Blitter, coarse, new_figure, nice
from nbdist.widgets._data import DashboardData

__all__ = [
    "BANDWIDTH_MIN_BYTES", "STUCK_S", "ReductionsPanels", "ReductionsView", "draw_reductions",
    "link_text", "op_totals",
]  # fmt: skip

BANDWIDTH_MIN_BYTES = 64 * 1024
"""Messages smaller than this are latency-bound: their time is the link's latency and the
collective's fixed cost, not bytes over a bandwidth, so no bandwidth is computed from them
(4-byte all-reduces gave "0.006 MB/s", which read as a broken link)."""

_TIMELINE = 200  # newest collectives drawn on the timeline
_WINDOW = 500  # collectives the blame is computed over
_SCATTER = 1_000  # newest collectives on the bandwidth chart
_WAITING, _WORKING = "#f4a261", "#2a6f97"
_COMPUTE = "#2a9d8f"
_OP, _NBYTES, _DURATION = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(5)

# Note [Fast redraw]: drawing a figure from scratch (Figure, axes, one artist per bar, ticks
# laid out anew, PNG at full compression) cost ~1 s for 10,000 records. The panels below are
# built once; a redraw sets the vertices of a few `PolyCollection`s and the offsets of one
# scatter per op, sets the limits from numpy min/max rounded up to round numbers (no
# autoscaling over artists), and encodes the PNG at compression level 1. Log axes are labelled
# with plain text (no mathtext layout). Most of a draw is the frame: axes, ticks and their
# labels. While the frame stays the same (the rounded limits, replicas, ops), `png()` restores
# the pixels of the frame drawn last time and draws only the data and the titles on it
# (matplotlib's blitting: the data artists are `animated`, left out of `canvas.draw()`).


def _si(value: float, _pos: Any = None) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


def _rate(value: float) -> str:
    """`22,300` for large rates, `1.25` for small ones (three significant digits there)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


class _MinorSI(Formatter):
    """Minor log ticks labelled 2 and 5 (plain text) while the axis spans under 2 decades."""

    def __call__(self, value: float, pos: Any = None) -> str:
        low, high = sorted(self.axis.get_view_interval())
        if low <= 0 or high / low > 100:
            return ""
        mantissa = value / 10 ** np.floor(np.log10(value) + 1e-9)
        return _si(value) if round(mantissa) in (2, 5) else ""


def _decades(low: float, high: float) -> tuple[float, float]:
    """Log-axis limits widened to whole powers of ten."""
    return 10.0 ** np.floor(np.log10(low)), 10.0 ** np.ceil(np.log10(high))


def _boxes(left: Any, right: Any, bottom: Any, top: Any) -> np.ndarray:
    """(n, 4, 2) rectangle vertices for a PolyCollection (arguments broadcast to n)."""
    left, right, bottom, top = np.broadcast_arrays(left, right, bottom, top)
    verts = np.empty((len(left), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = left
    verts[:, 2, 0] = verts[:, 3, 0] = right
    verts[:, 0, 1] = verts[:, 3, 1] = bottom
    verts[:, 1, 1] = verts[:, 2, 1] = top
    return verts


def link_text(records: list[CollectiveRecord]) -> str:
    """What the link did, as one line: the peak bandwidth over messages of at least
    `BANDWIDTH_MIN_BYTES`, and the median time of smaller ones (latency-bound).

    Example:
        >>> small = CollectiveRecord("all_reduce:SUM", 4, "gloo", (0, 1), 0.0, 4e-4, (0, 0))
        >>> link_text([small])
        'latency-bound (messages under 64 KiB): median 0.40 ms'
        >>> big = small._replace(nbytes=1 << 20, duration=0.01)
        >>> for part in link_text([small, big]).split(" · "): print(part)
        bandwidth (messages of 64 KiB or more): peak 105 MB/s
        latency-bound (under 64 KiB): median 0.40 ms
    """
    rates = [r.nbytes / r.duration for r in records
             if r.nbytes >= BANDWIDTH_MIN_BYTES and r.duration > 0]  # fmt: skip
    small = [r.duration for r in records if r.nbytes < BANDWIDTH_MIN_BYTES]
    latency = f"median {float(np.median(small)) * 1e3:.2f} ms" if small else ""
    if not rates:
        return f"latency-bound (messages under 64 KiB): {latency}" if small else ""
    text = f"bandwidth (messages of 64 KiB or more): peak {_rate(max(rates) / 1e6)} MB/s"
    return text + (f" · latency-bound (under 64 KiB): {latency}" if small else "")


def op_totals(records: list[tuple], aggregates: dict | None = None) -> dict[str, dict]:
    """Per op: `count`, `nbytes` and `seconds` over the kept records plus those folded into
    `aggregates` (`folded` says how many of `count` were folded): every record accounted for.

    Example:
        >>> op_totals([("all_gather", 8, "local", (0,), 0.0, 0.5, (0.0,))],
        ...           {"all_gather": {"count": 2, "nbytes": 16, "seconds": 1.0}})
        {'all_gather': {'count': 3, 'nbytes': 24, 'seconds': 1.5, 'folded': 2}}
    """
    counts = collections.Counter(map(_OP, records))  # map + itemgetter: C speed, 1M in ~40 ms
    out: dict[str, dict] = {}
    if len(counts) == 1:
        ((op, n),) = counts.items()
        out[op] = {"count": n, "nbytes": sum(map(_NBYTES, records)),
                   "seconds": float(sum(map(_DURATION, records))), "folded": 0}  # fmt: skip
    else:
        for op, n in counts.items():
            out[op] = {"count": n, "nbytes": 0, "seconds": 0.0, "folded": 0}
        for r in records:
            totals = out[r[0]]
            totals["nbytes"] += r[1]
            totals["seconds"] += r[5]
    for op, folded in (aggregates or {}).items():
        totals = out.setdefault(op, {"count": 0, "nbytes": 0, "seconds": 0.0, "folded": 0})
        totals["count"] += folded["count"]
        totals["nbytes"] += folded["nbytes"]
        totals["seconds"] += folded["seconds"]
        totals["folded"] += folded["count"]
    return out


class ReductionsPanels:
    """The four reduction panels in `fig` (a Figure or SubFigure), built once and updated by
    `show(data)` (see Note [Fast redraw]).

    Example:
        >>> from nbdist.widgets._canvas import Blitter, coarse, new_figure, nice
        >>> panels = ReductionsPanels(new_figure(9, 5.5))
        >>> panels.show(DashboardData())
    """

    def __init__(self, fig: Any):
        self.fig = fig
        self.timeline, self.waits, self.bandwidth, self.steps = fig.subplots(2, 2).ravel()
        # Edges as wide as a line, so a collective of a few microseconds still shows.
        self.waiting = self.timeline.add_collection(
            PolyCollection([], facecolors=_WAITING, edgecolors=_WAITING, linewidths=1.0)
        )
        self.working = self.timeline.add_collection(
            PolyCollection([], facecolors=_WORKING, edgecolors=_WORKING, linewidths=1.0)
        )
        self.timeline.set_xlabel("seconds (orange: waiting for others; black: a cell began)")
        self.cells = self.timeline.add_collection(LineCollection([], colors="#212529", lw=1.5))
        self.bars = self.waits.add_collection(PolyCollection([]))
        self.waits.set_xlabel("replica")
        self.waits.set_ylabel("others waited for it (ms)")
        self.bandwidth.set_xscale("log")
        self.bandwidth.set_yscale("log")
        for axis in (self.bandwidth.xaxis, self.bandwidth.yaxis):
            axis.set_major_formatter(FuncFormatter(_si))
            axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))  # fewer ticks to draw
            axis.set_minor_formatter(_MinorSI())
        for axis in (self.timeline.xaxis, self.waits.yaxis, self.steps.xaxis, self.steps.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=5))
        self.bandwidth.set_xlabel("message bytes (dotted: 64 KiB)")
        self.bandwidth.set_ylabel("ms")
        self.bandwidth.axvline(BANDWIDTH_MIN_BYTES, ls=":", lw=0.8, color="#6c757d")
        # the link's peak as measured over messages >= 64 KiB: time = bytes / peak bandwidth
        (self.peak,) = self.bandwidth.plot([1.0, 2.0], [1.0, 2.0], ls="--", lw=0.8,
                                           color="#6c757d", visible=False)  # fmt: skip
        self.scatters: dict[str, Any] = {}
        self.compute = self.steps.add_collection(PolyCollection([], facecolors=_COMPUTE))
        self.comm = self.steps.add_collection(PolyCollection([], facecolors=_WAITING))
        self.steps.set_xlabel("step")
        self.steps.set_ylabel("ms")
        self.steps.legend(
            handles=[Patch(color=_COMPUTE, label="compute"),
                     Patch(color=_WAITING, label="communication")],
            fontsize=7, loc="upper right",
        )  # fmt: skip
        self._replicas: list[int] = []
        self._bar_names: list[str] = []
        self._blit = Blitter(fig)
        self._steady = self._blit.steady

    def png(self) -> bytes:
        """The figure as PNG, drawing only the data when the frame (axes, ticks, labels,
        legends) is the one drawn last time (Note [Fast redraw])."""
        dynamic = [self.waiting, self.working, self.cells, self.bars, self.compute, self.comm,
                   self.peak,
                   self.timeline.title, self.waits.title, self.bandwidth.title,
                   *self.scatters.values()]  # fmt: skip
        frame = (
            [ax.get_xlim() + ax.get_ylim() for ax in (self.timeline, self.waits, self.bandwidth,
                                                       self.steps)],
            self._replicas, self._bar_names, sorted(self.scatters),
        )  # fmt: skip
        return self._blit.png(frame, dynamic)

    def show(self, data: DashboardData) -> None:
        """Put `data`'s numbers into the panels (draws nothing by itself)."""
        records = data.collectives
        before = records[-_TIMELINE - 1].start if len(records) > _TIMELINE else float("-inf")
        self._timeline(records[-_TIMELINE:], data.marks, before)
        self._blame(records)
        self._bandwidth(records[-_SCATTER:])
        self._steps(step_split(data.steps[-_TIMELINE:], records[-4 * _TIMELINE :]))

    def _timeline(
        self, recent: list[CollectiveRecord], marks: dict[int, list] | None = None,
        before: float = 0.0,
    ) -> None:
        # A cell starts before its first collective: marks after the last collective left
        # out of the window (`before`) belong to it, and the window begins at the earliest.
        shown = [(replica, at) for replica, found in (marks or {}).items()
                 for at, _ in found if at > before]  # fmt: skip
        t0 = recent[0].start if recent else 0.0
        if recent and shown:
            t0 = min(t0, min(at for _, at in shown))
        rows, arrival, wait, work = [], [], [], []
        for _, _, _, reps, start, duration, w in recent:
            latest = max(w) if len(w) > 1 else 0.0
            for replica, waited in zip(reps, w):
                rows.append(replica)
                offset = latest - waited  # this replica arrived `offset` after the first
                arrival.append(start + offset - t0)
                wait.append(waited)
                work.append(max(duration - offset - waited, 0.0))
        y, x = np.asarray(rows, float), np.asarray(arrival)
        wait_a, work_a = np.asarray(wait), np.asarray(work)
        self.waiting.set_verts(_boxes(x, x + wait_a, y - 0.4, y + 0.4))
        self.working.set_verts(_boxes(x + wait_a, x + wait_a + work_a, y - 0.4, y + 0.4))
        replicas = sorted(set(rows))
        if replicas != self._replicas:
            self._replicas = replicas
            self.timeline.set_yticks(replicas, [f"replica {r}" for r in replicas])
        ax = self.timeline
        ax.set_ylim(min(replicas, default=0) - 0.6, max(replicas, default=1) + 0.6)
        end = float((x + wait_a + work_a).max()) if len(x) else 1.0
        ax.set_xlim(*self._steady("timeline.x", 0.0, nice(end * 1.02)))
        self.cells.set_segments([  # cell starts inside the window, on their replica's row
            [(at - t0, replica - 0.5), (at - t0, replica + 0.5)]
            for replica, at in shown if replica in replicas and at - t0 <= end
        ])  # fmt: skip
        ax.set_title(f"last {len(recent)} collectives", fontsize=9)

    def _blame(self, records: list[tuple]) -> None:
        totals = blame(records, _WINDOW)
        late = straggler(records, _WINDOW)
        names = [str(r) for r in totals]
        heights = np.array([v * 1e3 for v in totals.values()])
        positions = np.arange(len(names), dtype=float)
        self.bars.set_verts(_boxes(positions - 0.4, positions + 0.4, 0.0, heights))
        self.bars.set_facecolors(["#e63946" if r == late else "#8d99ae" for r in totals])
        if names != self._bar_names:
            self._bar_names = names
            self.waits.set_xticks(positions, names)
        self.waits.set_xlim(-0.6, max(len(names), 1) - 0.4)
        top = float(heights.max()) if len(heights) else 0.0
        self.waits.set_ylim(0.0, coarse(top))  # grows with the window: redrawn rarely
        self.waits.set_title(
            f"straggler: replica {late}" if late is not None else "no straggler", fontsize=9
        )

    def _bandwidth(self, chosen: list[CollectiveRecord]) -> None:
        """Time by message size, per op; a bandwidth only over messages of at least
        `BANDWIDTH_MIN_BYTES` (the dashed line: their peak), smaller ones latency-bound."""
        by_op: dict[str, tuple[list, list]] = {}
        peak = 0.0
        small: list[float] = []
        for r in chosen:
            if r.duration > 0 and r.nbytes > 0:
                xs, ys = by_op.setdefault(r.op, ([], []))
                xs.append(r.nbytes)
                ys.append(r.duration * 1e3)
                if r.nbytes >= BANDWIDTH_MIN_BYTES:
                    peak = max(peak, r.nbytes / r.duration)
                else:
                    small.append(r.duration)
        ax = self.bandwidth
        if set(by_op) != set(self.scatters):
            for artist in self.scatters.values():
                artist.remove()
            self.scatters = {op: ax.scatter([], [], s=6, label=op) for op in sorted(by_op)}
            if self.scatters:
                ax.legend(fontsize=7, loc="upper left")
            elif ax.get_legend() is not None:
                ax.get_legend().remove()
        lows, highs = [], []
        for op, (xs, ys) in by_op.items():
            points = np.column_stack([xs, ys])
            self.scatters[op].set_offsets(points)
            lows.append(points.min(axis=0))
            highs.append(points.max(axis=0))
        if not lows:
            ax.set_xlim(1.0, 1e6)
            ax.set_ylim(1e-2, 1e2)
            self.peak.set_visible(False)
            ax.set_title("time by message size", fontsize=9)
            return
        low, high = np.min(lows, axis=0), np.max(highs, axis=0)
        right = max(high[0] * 1.5, BANDWIDTH_MIN_BYTES * 1.5)  # the 64 KiB line in view
        ax.set_xlim(*self._steady("bandwidth.x", *_decades(low[0] / 1.5, right)))
        ax.set_ylim(*self._steady("bandwidth.y", *_decades(low[1] / 1.5, high[1] * 1.5)))
        parts = []
        if peak > 0:
            xs = np.array([BANDWIDTH_MIN_BYTES, ax.get_xlim()[1]], float)
            self.peak.set_data(xs, xs / peak * 1e3)
            parts.append(f"peak {_rate(peak / 1e6)} MB/s (≥ 64 KiB)")
        self.peak.set_visible(peak > 0)
        if small:
            parts.append(f"latency-bound: median {float(np.median(small)) * 1e3:.2f} ms")
        ax.set_title(" · ".join(parts), fontsize=9)

    def _steps(self, split: list[tuple]) -> None:
        if not split:
            self.compute.set_verts([])
            self.comm.set_verts([])
            self.steps.set_xlim(0.0, 1.0)
            self.steps.set_ylim(0.0, 1.0)
            return
        parts = np.asarray(split, float)
        comm = parts[:, 2] * 1e3
        compute = (parts[:, 1] - parts[:, 2]) * 1e3
        xs = np.arange(len(split), dtype=float)

        def band(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
            return np.concatenate([np.column_stack([xs, lower]),
                                   np.column_stack([xs[::-1], upper[::-1]])])  # fmt: skip

        self.compute.set_verts([band(np.zeros_like(compute), compute)])
        self.comm.set_verts([band(compute, compute + comm)])
        self.steps.set_xlim(0.0, min(coarse(len(split) - 1), nice(_TIMELINE)))
        top = float((compute + comm).max())
        self.steps.set_ylim(*self._steady("steps.y", 0.0, nice(top * 1.15)))


def draw_reductions(fig: Any, data: DashboardData) -> None:
    """Draw the four reduction panels into `fig` (a Figure or SubFigure)."""
    ReductionsPanels(fig).show(data)


def stuck_html(data: DashboardData, now: float | None = None) -> str:
    """A red note per collective waiting longer than `STUCK_S` (empty when none is)."""
    now = time.time() if now is None else now
    notes = []
    for s in stuck(data.pending, now):
        since = time.strftime("%H:%M:%S", time.localtime(s["since"]))
        arrived = ", ".join(str(r) for r in s["arrived"]) or "none"
        missing = ", ".join(str(r) for r in s["missing"]) or "none"
        notes.append(
            f"<div class='nd-stuck' style='color:#e63946;font-weight:bold'>⚠ stuck: "
            f"{html.escape(s['op'])} waiting since {since} ({s['waited']:.0f} s) · arrived: "
            f"replica(s) {arrived} · not arrived: "
            f"<span class='nd-missing'>replica(s) {missing}</span> · where each replica is: "
            f"<code>%dist stack</code></div>"
        )
    return "".join(notes)


def _totals_html(totals: dict[str, dict]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(op)}</td><td class='nd-op-count'>{t['count']}</td>"
        f"<td>{t['folded']}</td><td>{t['nbytes']}</td>"
        f"<td>{t['seconds'] / t['count'] * 1e3 if t['count'] else 0:.3f}</td></tr>"
        for op, t in sorted(totals.items())
    )
    return (
        "<table class='nd-op-totals'><tr><th>op</th><th>count</th><th>folded</th><th>bytes</th>"
        f"<th>mean ms</th></tr>{rows}</table>"
    )


class ReductionsView:
    """The reductions view: an `ipywidgets.Image` redrawn only when records changed, and a
    caption (straggler, records per op, a stuck collective) updated on every refresh."""

    title = "Reductions"

    def __init__(self) -> None:
        self.image = ipywidgets.Image(format="png")
        self.caption = ipywidgets.HTML()
        self.caption.add_class("nd-reductions-caption")
        self.widget = ipywidgets.VBox([self.caption, self.image])
        self.key: Any = None
        self.straggler: int | None = None
        self.straggler_host: str | None = None
        """The straggler's host, where the replicas run on more than one host (else None)."""
        self.slow_link: list[int] = []
        """The replicas on a host whose link to the notebook is slow (Note [Slow links] in
        `nbdist.cluster.links`): stragglers that "who waited for whom" cannot show."""
        self._slow_text = ""
        self.count = 0
        self.totals: dict[str, dict] = {}
        self.stuck = ""
        self.link = ""
        """`link_text` of the newest collectives (bandwidth, or latency-bound)."""
        self._summary = ""
        self._panels: ReductionsPanels | None = None

    def update(self, data: DashboardData) -> bool:
        records = data.collectives
        stuck_note = stuck_html(data)
        hosts = {row.replica: row.host for row in data.engines}
        if data.link_rates:  # measured on an explicit refresh; one in the thread keeps them
            self.slow_link = slow_links(data.link_rates, hosts)
            self._slow_text = _slow_text(self.slow_link, data.link_rates, hosts)
        key = (len(records), records[-1].start if records else None, len(data.steps),
               self._slow_text)  # fmt: skip
        if key == self.key:
            if stuck_note != self.stuck:
                self.stuck = stuck_note
                self.caption.value = stuck_note + self._summary
            return False
        self.key = key
        self.count = len(records)
        self.totals = op_totals(records, data.aggregates)
        self.straggler = straggler(records, _WINDOW)
        self.straggler_host = _host_of(self.straggler, data)
        self.link = link_text(records[-_SCATTER:])
        if self._panels is None:
            self._panels = ReductionsPanels(new_figure(9, 5.5))
        self._panels.show(data)
        self.image.value = self._panels.png()
        late = self._late()
        folded = sum(t["folded"] for t in self.totals.values())
        self._summary = (
            f"<span class='nd-count'>{self.count}</span> collectives"
            + (f" (+{folded} older, folded into the totals)" if folded else "")
            + f" · straggler: {late}"
            + html.escape(self._slow_text)
            + (f"<div class='nd-link'>{html.escape(self.link)}</div>" if self.link else "")
            + _totals_html(self.totals)
        )
        self.stuck = stuck_note
        self.caption.value = stuck_note + self._summary
        return True

    def _late(self) -> str:
        """The straggler as the caption names it: replica 1, replica 2 on h2 (replicas on
        several hosts), or none."""
        if self.straggler is None:
            return "none"
        where = f" on {self.straggler_host}" if self.straggler_host else ""
        return f"replica {self.straggler}{where}"

    @property
    def summary(self) -> str:
        """The caption as plain text, for `print` (the caption itself is HTML for the widget).

        Example (a view that has not been refreshed yet):
            >>> ReductionsView().summary
            '0 collectives · straggler: none'
        """
        late = self._late()
        folded = sum(t["folded"] for t in self.totals.values())
        lines = [
            f"{self.count} collectives"
            + (f" (+{folded} older, folded into the totals)" if folded else "")
            + f" · straggler: {late}"
            + self._slow_text
        ]
        if self.link:
            lines.append(self.link)
        for op, t in sorted(self.totals.items()):
            mean_ms = t["seconds"] / t["count"] * 1e3 if t["count"] else 0.0
            lines.append(
                f"  {op}: {t['count']} calls, {t['nbytes']} bytes, mean {mean_ms:.3f} ms"
            )
        if self.stuck:
            lines.insert(0, re.sub(r"<[^>]+>", "", self.stuck.replace("</div>", "\n")).strip())
        return "\n".join(lines)


def _host_of(replica: int | None, data: DashboardData) -> str | None:
    """`replica`'s host when the engines run on more than one host (else None: one machine's
    name would say nothing)."""
    hosts = {row.replica: row.host for row in data.engines}
    if replica is None or len(set(hosts.values())) < 2:
        return None
    return hosts.get(replica)


def _slow_text(slow: list[int], rates: dict[int, float], hosts: dict[int, str]) -> str:
    """The caption's slow-link part (Note [Slow links] in `nbdist.cluster.links`), empty when
    no link is slow.

    Example:
        >>> _slow_text([1], {0: 3e8, 1: 1.2e7}, {0: "h1", 1: "h2"})
        ' · slow link: replica 1 on h2 (12.0 MB/s to the notebook; h1 300.0 MB/s)'
    """
    if not slow:
        return ""
    best: dict[str, float] = {}
    for replica, rate in rates.items():
        best[hosts[replica]] = max(best.get(hosts[replica], 0.0), rate)
    slow_hosts = sorted({hosts[r] for r in slow})
    others = "; ".join(f"{h} {best[h] / 1e6:.1f} MB/s" for h in sorted(best) if h not in slow_hosts)
    names = ", ".join(str(r) for r in slow)
    mine = ", ".join(f"{best[h] / 1e6:.1f} MB/s" for h in slow_hosts)
    return (
        f" · slow link: replica{'s' if len(slow) > 1 else ''} {names} on {', '.join(slow_hosts)}"
        f" ({mine} to the notebook; {others})"
    )
