"""JupyterLab's visual debugger on replicas in a real JupyterLab and headless Chromium (issue
31, item 3): with the debugger switched on (the bug button), a breakpoint clicked in the
gutter of a `%%distribute` cell stops both replicas; the Callstack panel shows the frames of
`replica 0` and `replica 1`, the Variables panel the chosen replica's values; Continue
finishes the cell with the same result as without the breakpoint. The screenshot is copied
to docs/images/debugger-visual.png with NBDIST_UPDATE_DOC_IMAGES=1 (docs/debugging.md).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import nbformat
import psutil
import pytest

from nbdist.testing import assert_processes_gone
from nbdist.testing.jupyterlab import JupyterLab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

IMAGES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "images"
UPDATE_IMAGES = os.environ.get("NBDIST_UPDATE_DOC_IMAGES") == "1"
CELLS = [
    "%load_ext nbdist\n%dist start -n 2",
    (
        "%%distribute\n"
        "rank = strategy.cluster_resolver.task_id\n"
        "x = 10 * (rank + 1)\n"
        "y = x + 1\n"
        "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(y))), axis=None)\n"
        "(x, y, float(total))"
    ),
    "%dist stop",
]


def _click_gutter(page, index: int, line: int) -> None:
    """Click the breakpoint gutter of cell `index` beside its line `line` (1-based)."""
    cell = page.page.locator(".jp-Notebook .jp-Cell").nth(index)
    gutter = cell.locator("div.cm-gutter.cm-breakpoint-gutter")
    gutter.wait_for(state="visible", timeout=60_000)
    box = gutter.bounding_box()
    text = cell.locator(".cm-content .cm-line").nth(line - 1).bounding_box()
    page.page.mouse.click(box["x"] + box["width"] / 2, text["y"] + text["height"] / 2)


def test_the_visual_debugger_stops_both_replicas_in_jupyterlab(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, tmp_path / "visual.ipynb")
    started: tuple[int, ...] = ()
    with JupyterLab(tmp_path) as lab, lab.open("visual.ipynb") as page:
        page.run_cell(0)
        page.wait_for_text("Started in", timeout=180)
        started = tuple(p.pid for p in psutil.Process().children(recursive=True))

        page.page.locator(".jp-DebuggerBugButton").first.click()  # switch the debugger on
        _click_gutter(page, 1, 4)
        page.wait_for(".jp-DebuggerBreakpoint", timeout=60)  # listed in the Breakpoints panel
        page.command("debugger:show-panel")
        page.start_cell(1)

        frames = page.page.locator(".jp-DebuggerCallstackFrame-name")
        for rank in (0, 1):
            frames.get_by_text(f"replica {rank}: <module>").first.wait_for(
                state="visible", timeout=120_000
            )
        variables = page.page.locator(".jp-DebuggerVariables")
        variables.get_by_text("20", exact=True).first.wait_for(state="visible", timeout=60_000)
        shot = tmp_path / "debugger-visual.png"
        page.screenshot(shot, full_page=False)
        assert shot.stat().st_size > 20_000
        if UPDATE_IMAGES:
            IMAGES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, IMAGES / shot.name)

        # choosing replica 0: click its frame; the Variables panel shows its x
        frames.get_by_text("replica 0: <module>").first.click()
        variables.get_by_text("10", exact=True).first.wait_for(state="visible", timeout=60_000)
        assert variables.get_by_text("20", exact=True).count() == 0

        page.page.evaluate(  # the Continue button (F9); not waiting for its promise
            "() => { window.jupyterapp.commands.execute('debugger:continue'); return null; }"
        )
        page.wait_for_text("PerReplica:{0: (10, 11, 32.0), 1: (20, 21, 32.0)}", timeout=120)
        page.page.locator(".jp-DebuggerBugButton").first.click()  # and off again
        page.run_cell(2)
        page.wait_for_text("Cluster stopped", timeout=120)
    assert_processes_gone(started, deadline_s=30)
