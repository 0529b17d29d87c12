"""The placement view: per replica (engine) and device, what it holds (parameters, buffers,
`nd.Variable`s: count and bytes, by module name) and its memory in use."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets

from nbdist.widgets._data import DashboardData

__all__ = ["PlacementView", "placement_html"]


TABLE_STYLE = (
    "<style>.nd-dashboard table{border-collapse:collapse;margin:4px 0}"
    ".nd-dashboard th,.nd-dashboard td{padding:4px 14px;text-align:left}"
    ".nd-dashboard th{border-bottom:1px solid #bbb}"
    ".nd-dashboard tr:nth-child(even) td{background:rgba(0,0,0,0.03)}"
    ".nd-dashboard .nd-state{border-radius:9px;padding:1px 9px;font-weight:bold}"
    "</style>"
)
"""Spacing for every table in the dashboard (a `<style>` inside the widget's HTML applies to
the whole page, so it is scoped to `.nd-dashboard`)."""


def _size(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def placement_html(data: DashboardData) -> str:
    """An HTML table: one row per replica, device, kind and module."""
    rows = []
    for replica, items in sorted(data.holdings.items()):
        memory = _size(data.memory.get(replica))
        for item in items:
            rows.append(
                f"<tr><td>{replica}</td><td>{html.escape(item['device'])}</td>"
                f"<td>{item['kind']}</td><td>{html.escape(item['module'])}</td>"
                f"<td>{item['count']}</td><td class='nd-bytes'>{item['bytes']}</td>"
                f"<td>{_size(item['bytes'])}</td><td>{memory}</td></tr>"
            )
    if not rows:
        rows.append("<tr><td colspan=8>nothing held yet (no modules or nd.Variables)</td></tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("replica", "device", "kind", "module", "tensors", "bytes", "size", "memory")
    )
    return (
        f"{TABLE_STYLE}<table class='nd-table nd-placement'><tr>{head}</tr>{''.join(rows)}</table>"
    )


class PlacementView:
    """The placement view as an `ipywidgets.HTML` table."""

    title = "Placement"

    def __init__(self) -> None:
        self.widget = ipywidgets.HTML()
        self.rows: dict[Any, list] = {}

    def update(self, data: DashboardData) -> bool:
        text = placement_html(data)
        if text == self.widget.value:
            return False
        self.rows = data.holdings
        self.widget.value = text
        return True
