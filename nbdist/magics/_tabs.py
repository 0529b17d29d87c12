"""`%%distribute --output tabs`: one tab per replica, live, opening on a failed one.

`TabsPrinter` is the cell's output printer (`nbdist.cluster.output.OutputPrinter`, the one
every engine call uses) with another destination: instead of `[N] line` on the notebook's
streams, each replica's lines go into its own `ipywidgets.Output` inside one `ipywidgets.Tab`,
as they arrive, with what it displays (figures, HTML). Each tab's label says the replica's
state and how many lines it printed (`[2] running · 40 lines`, `[1] ✗ failed · 3 lines`); a
replica that fails gets its traceback (its own frames) in its tab, and the view switches to
the first failed tab. `nd.progress` bars are drawn under the tabs, as in the other modes.

Note [A static view for the saved notebook]: a widget is a view of a model that lives in the
kernel; a notebook opened later without that kernel has no model and would show "Error
displaying widget" (or nothing). So when the cell ends the live tabs are replaced, in place
(`update_display`), by a static version: plain HTML and CSS tabs (radio buttons and labels,
no script), opening on the first failed replica, and a `text/plain` copy of every line,
prefixed `[N]` as the default stream prints it. Replicas whose output and state are identical
share one tab (`[0, 2, 3] done · 5 lines`). Where the HTML is sanitised (an untrusted
notebook: no `<style>`, no inputs), every panel still reads in order under its own heading.

Example (in a notebook with running engines)::

    %%distribute --output tabs
    print(f"step {rank}")
"""

from __future__ import annotations

import base64
import html
import re
import secrets
from collections.abc import Sequence
from typing import Any

from nbdist.cluster.replies import failure_of, reply_of, reply_ok
from nbdist.cluster.status import EngineInfo
from nbdist.magics._cell_printer import CellPrinter

__all__ = ["ReplicaOutput", "TabsPrinter", "static_view"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LIVE_CLASS = "nbdist-live-tabs"
_TAB_WIDTH = "--jp-widgets-horizontal-tab-width: 190px;"
"""ipywidgets' tabs are 144 px wide: too narrow for `[0] running · 12 lines`."""


class ReplicaOutput:
    """What one replica showed: its output items, line count and state."""

    def __init__(self, rank: int):
        self.rank = rank
        self.items: list[tuple[str, Any]] = []  # ("stdout"|"stderr", text) or ("data", bundle)
        self.lines = 0
        self.state = "running"

    def label(self, ranks: Sequence[int] | None = None) -> str:
        who = ", ".join(str(r) for r in (ranks or [self.rank]))
        mark = "✗ " if self.state == "failed" else ""
        count = f"{self.lines} line" + ("" if self.lines == 1 else "s")
        return f"[{who}] {mark}{self.state} · {count}"

    def key(self) -> tuple:
        return (self.state, self.lines, repr(self.items))


class TabsPrinter(CellPrinter):
    """Shows each replica's output in its own tab (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("all")
        self.replicas: list[ReplicaOutput] = []
        self.selected_failure = False

    def start(self, engines: Sequence[EngineInfo], parts: list[Any]) -> None:
        import ipywidgets
        from IPython.display import display

        super().start(engines, parts)
        self.replicas = [ReplicaOutput(info.rank) for info in engines]
        self.outputs = [ipywidgets.Output() for _ in engines]
        self.tab = ipywidgets.Tab(children=self.outputs)
        self.tab.add_class(_LIVE_CLASS)
        wide = ipywidgets.HTML(f"<style>.{_LIVE_CLASS} {{ {_TAB_WIDTH} }}</style>")
        self.view = ipywidgets.VBox([wide, self.tab])
        self._retitle()
        self.handle = display(self.view, display_id=True)

    def write_lines(self, rank: int, stream_name: str, lines: list[str]) -> None:
        index = self._index(rank)
        text = "".join(line + "\n" for line in lines)
        replica = self.replicas[index]
        if replica.items and replica.items[-1][0] == stream_name:  # one block per run of lines
            replica.items[-1] = (stream_name, replica.items[-1][1] + text)
        else:
            replica.items.append((stream_name, text))
        replica.lines += len(lines)
        if stream_name == "stdout":
            self.outputs[index].append_stdout(text)
        else:
            self.outputs[index].append_stderr(text)
        self._retitle()

    def show(self, rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        index = self._index(rank)
        self.replicas[index].items.append(("data", data))
        shown = {"output_type": "display_data", "data": data, "metadata": metadata}
        self.outputs[index].outputs = (*self.outputs[index].outputs, shown)

    def poll(self, final: bool = False) -> None:
        super().poll(final)
        changed = False
        for index, (info, part) in enumerate(zip(self.engines, self.parts)):
            replica = self.replicas[index]
            if replica.state != "running" or not part.ready():
                continue
            reply = reply_of(part)
            if reply_ok(reply):
                replica.state = "done"
            else:
                replica.state = "failed"
                self._show_failure(index, info, reply)
                if not self.selected_failure:
                    self.selected_failure = True
                    self.tab.selected_index = index
            changed = True
        if changed:
            self._retitle()

    def finish(self) -> None:
        """The rest of the output, then the static view in the widget's place (Note [A static
        view for the saved notebook])."""
        super().finish()
        bundle = static_view(self.replicas)
        self.handle.update(bundle, raw=True)
        for widget in (*self.outputs, self.tab, *self.view.children, self.view):
            widget.close()

    def _show_failure(self, index: int, info: EngineInfo, reply: Any) -> None:
        failure = failure_of(info, reply)
        if failure.secondary:
            text = f"{failure.ename}: {failure.evalue}\n"
        else:
            text = _ANSI.sub("", failure.short or failure.traceback or "").rstrip("\n")
            last = f"{failure.ename}: {failure.evalue}".strip()
            text = f"{text}\n" if text.endswith(last) else f"{text}\n{last}\n".lstrip("\n")
        self.replicas[index].items.append(("error", text))
        self.outputs[index].append_stderr(text)

    def _retitle(self) -> None:
        self.tab.titles = tuple(replica.label() for replica in self.replicas)

    def _index(self, rank: int) -> int:
        return next(i for i, info in enumerate(self.engines) if info.rank == rank)


def static_view(replicas: Sequence[ReplicaOutput]) -> dict[str, str]:
    """The saved form of the tabs: `{"text/html": ..., "text/plain": ...}` (Note [A static
    view for the saved notebook]); groups replicas with identical output in one tab."""
    groups: dict[tuple, list[ReplicaOutput]] = {}
    for replica in replicas:
        groups.setdefault(replica.key(), []).append(replica)
    tabs = [(members[0], [r.rank for r in members]) for members in groups.values()]
    chosen = next((i for i, (r, _) in enumerate(tabs) if r.state == "failed"), 0)
    uid = f"nbdist-tabs-{secrets.token_hex(4)}"  # unique across sessions: ids in one page
    css = [
        f".{uid} > input {{ display: none; }}",
        f".{uid} > label {{ display: inline-block; padding: 3px 10px; margin-right: 2px;"
        " border: 1px solid #bbb; border-bottom: none; border-radius: 4px 4px 0 0;"
        " cursor: pointer; background: #eee; font-family: monospace; font-size: 12px; }",
        f".{uid} > label.failed {{ color: #b00020; }}",
        f".{uid} > .panel {{ display: none; border: 1px solid #bbb; padding: 4px 8px; }}",
        f".{uid} > .panel > h4 {{ display: none; }}",
        f".{uid} pre {{ margin: 0; white-space: pre-wrap; }}",
        f".{uid} pre.err {{ background: #fdd; }}",
    ]
    heads, panels = [], []
    for index, (replica, ranks) in enumerate(tabs):
        ident = f"{uid}-{index}"
        label = html.escape(replica.label(ranks))
        checked = " checked" if index == chosen else ""
        failed = ' class="failed"' if replica.state == "failed" else ""
        heads.append(
            f'<input type="radio" name="{uid}" id="{ident}"{checked}>'
            f'<label for="{ident}"{failed}>{label}</label>'
        )
        css.append(f"#{ident}:checked ~ .panel-{index} {{ display: block; }}")
        css.append(f"#{ident}:checked + label {{ background: #fff; font-weight: bold; }}")
        body = "".join(_item_html(kind, value) for kind, value in replica.items)
        panels.append(
            f'<div class="panel panel-{index}"><h4>{label}</h4>{body or "<pre>(no output)</pre>"}'
            "</div>"
        )
    page = (
        f'<div class="{uid}"><style>{" ".join(css)}</style>{"".join(heads)}{"".join(panels)}</div>'
    )
    plain = []
    for replica in replicas:
        plain.append(f"[{replica.rank}] ({replica.label()})")
        for kind, value in replica.items:
            if kind != "data":
                plain.extend(f"[{replica.rank}] {line}" for line in str(value).splitlines())
    return {"text/html": page, "text/plain": "".join(line + "\n" for line in plain)}


def _item_html(kind: str, value: Any) -> str:
    if kind == "data":
        for mime in ("image/png", "image/jpeg"):
            if mime in value:
                data = value[mime]
                data = data if isinstance(data, str) else base64.b64encode(data).decode()
                return f'<img src="data:{mime};base64,{data}">'
        if "text/html" in value:
            return str(value["text/html"])
        return f"<pre>{html.escape(str(value.get('text/plain', '')))}</pre>"
    css = "" if kind == "stdout" else ' class="err"'
    return f"<pre{css}>{html.escape(_ANSI.sub('', str(value)))}</pre>"
