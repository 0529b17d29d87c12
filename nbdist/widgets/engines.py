"""The engines view: alive / busy / dead, host, pid, device, memory and last heartbeat."""

from __future__ import annotations

import html
import time

import ipywidgets

from nbdist.widgets._data import DashboardData
from nbdist.widgets.placement import TABLE_STYLE, _size

__all__ = ["EnginesView", "engines_html", "history_html"]

_COLORS = {"alive": "#2a9d8f", "busy": "#e9c46a", "dead": "#e63946"}


def engines_html(data: DashboardData) -> str:
    """An HTML table, one row per engine (replica), its state coloured."""
    now = time.time()
    rows = []
    for e in data.engines:
        beat = f"{now - e.heartbeat:.0f} s ago" if e.heartbeat else "–"
        color = _COLORS.get(e.state, "#888")
        text = "#3d3000" if e.state == "busy" else "white"  # readable on yellow
        rows.append(
            f"<tr class='nd-engine nd-{e.state}'><td>{e.replica}</td>"
            f"<td><span class='nd-state' style='background:{color};color:{text}'>"
            f"{e.state}</span></td>"
            f"<td>{html.escape(str(e.host))}</td><td>{e.pid}</td>"
            f"<td>{html.escape(str(e.device))}</td><td>{_size(e.memory)}</td>"
            f"<td>{beat}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("replica", "state", "host", "pid", "device", "memory", "last heard")
    )
    note = f"<p class='nd-note'>{html.escape(data.note)}</p>" if data.note else ""
    return (
        f"{TABLE_STYLE}{note}<table class='nd-table nd-engines'><tr>{head}</tr>{''.join(rows)}"
        f"</table>{history_html(data.size_history)}"
    )


def history_html(history: list) -> str:
    """The size history (`%dist scale`) as an HTML table, or "" for a cluster never resized:
    when, from how many engines to how many, why, how long it took.

    Example:
        >>> from nbdist.cluster.size_history import SizeChange
        >>> "2 → 3" in history_html([SizeChange(0.0, 0, 2, "start"),
        ...                          SizeChange(60.0, 2, 3, "scale 2 → 3", 3.1)])
        True
    """
    if len(history) < 2:
        return ""
    rows = "".join(
        f"<tr class='nd-resize'><td>{time.strftime('%H:%M:%S', time.localtime(c.when))}</td>"
        f"<td>{c.old} → {c.new}</td><td>{html.escape(c.why)}</td><td>{c.seconds:.1f} s</td></tr>"
        for c in history
    )
    head = "".join(f"<th>{h}</th>" for h in ("when", "engines", "why", "took"))
    return (
        "<p class='nd-note'>size history</p>"
        f"<table class='nd-table nd-history'><tr>{head}</tr>{rows}</table>"
    )


class EnginesView:
    """The engines view as an `ipywidgets.HTML` table."""

    title = "Engines"

    def __init__(self) -> None:
        self.widget = ipywidgets.HTML()
        self.states: dict[int, str] = {}

    def update(self, data: DashboardData) -> bool:
        self.states = {e.replica: e.state for e in data.engines}
        text = engines_html(data)
        if text == self.widget.value:
            return False
        self.widget.value = text
        return True
