"""`%%distribute --output tabs` in a real JupyterLab and headless Chromium (issue 27, item 4).

4 engines print; replica 2 fails after its first line while the others go on printing. After
`%dist output auto`, a cell without `--output` shows tabs too (more than 2 replicas in a
kernel; the default stays the prefixed stream, as API.md §9 fixes). While
the cell runs, the tabs are a live widget that switches to replica 2's tab and marks it; when the
cell ends they become a static view (Note [A static view for the saved notebook] in
`nbdist.magics._tabs`) that still opens on replica 2. The notebook is saved and opened again
with a fresh kernel (the widgets' models gone): the static view renders from the file alone.
Screenshots go to the test's folder and, with NBDIST_SHOTS_DIR set, there too.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import nbformat
import psutil
import pytest

from nbdist.testing import assert_processes_gone
from nbdist.testing.jupyterlab import JupyterLab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

SHOTS = os.environ.get("NBDIST_SHOTS_DIR")
FAILING = """%%distribute --output tabs
import os, time
rank = int(os.environ['RANK'])
for step in range(8):
    print(f'replica {rank} step {step}', flush=True)
    if rank == 2:
        raise ValueError('replica 2 ran out of data')
    time.sleep(0.5)
"""
AUTO = "%%distribute\nprint('by default', rank)"  # no --output, after `%dist output auto`: tabs
CELLS = ["%load_ext nbdist\n%dist start -n 4\n%dist output auto", FAILING, AUTO, "%dist stop"]
CURRENT_TAB = ".jp-Cell >> nth=1 >> .lm-TabBar-tab.lm-mod-current"


def _shoot(page, tmp_path, name: str) -> pathlib.Path:
    shot = page.screenshot(tmp_path / f"{name}.png")
    assert shot.stat().st_size > 5_000
    if SHOTS:
        pathlib.Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, pathlib.Path(SHOTS) / f"{name}.png")
    return shot


def _chosen_panel(page, index: int) -> str:
    """The text of the static view's one visible panel in cell `index` of the notebook shown
    (waits until there is exactly one)."""
    found = page.wait_until(
        "(i) => { const nb = [...document.querySelectorAll('.jp-NotebookPanel')]"
        ".find((p) => p.offsetParent !== null); if (!nb) { return null; }"
        " const cell = nb.querySelectorAll('.jp-Cell')[i]; if (!cell) { return null; }"
        " const shown = [...cell.querySelectorAll(\"[class^='nbdist-tabs-'] > .panel\")]"
        ".filter((p) => p.offsetParent !== null);"
        " return shown.length === 1 ? shown[0].innerText : null; }",
        index,
        timeout=30,
    )
    return found.json_value()


def test_tabs_open_on_the_failed_replica_live_and_in_the_saved_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, tmp_path / "tabs.ipynb")
    lab = JupyterLab(tmp_path)
    started: tuple[int, ...] = ()
    with lab:
        with lab.open("tabs.ipynb") as page:
            page.run_cell(0)
            page.wait_for_text("Started in", timeout=180)
            started = tuple(p.pid for p in psutil.Process().children(recursive=True))

            page.start_cell(1)  # the others print for 4 s after replica 2 failed
            current = page.wait_for(CURRENT_TAB, timeout=120)
            page.wait_until(
                "(s) => { const t = document.querySelectorAll('.jp-Cell')[1]"
                ".querySelector('.lm-TabBar-tab.lm-mod-current');"
                " return t && t.textContent.includes('[2] ✗ failed'); }",
                timeout=60,
            )
            labels = page.page.locator(".jp-Cell >> nth=1 >> .lm-TabBar-tab").all_inner_texts()
            assert any("[0] running" in label for label in labels), labels
            _shoot(page, tmp_path, "tabs-live-failed")
            assert "[2] ✗ failed" in current.inner_text()
            output = page.page.locator(".jp-Cell >> nth=1 >> .widget-output:visible")
            live = output.first.inner_text()
            assert "replica 2 step 0" in live and "ValueError: replica 2 ran out of data" in live

            page.wait_for_text("RemoteError", timeout=120)  # the cell's error, under the view
            shown = _chosen_panel(page, 1)
            assert "replica 2 step 0" in shown and "ValueError" in shown, shown
            assert "replica 0 step" not in shown
            static = page.page.locator(".jp-Cell >> nth=1 >> [class^='nbdist-tabs-'] > label")
            labels = static.all_inner_texts()
            assert "[2] ✗ failed · 1 line" in labels, labels
            assert "[0] done · 8 lines" in labels, labels
            _shoot(page, tmp_path, "tabs-ended-failed")

            page.run_cell(2)
            page.wait_for_text("[3] done · 1 line", timeout=120)
            assert "by default 0" in _chosen_panel(page, 2)  # no failure: the first tab
            assert "[0] by default" not in page.page.locator(".jp-Cell >> nth=2").inner_text()

            page.run_cell(3)
            page.wait_for_text("Cluster stopped", timeout=120)
            page.command("docmanager:save")
            page.wait_until(
                "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30
            )
            page.command("application:close-all")  # not restored behind the next notebook

        saved = json.loads((tmp_path / "tabs.ipynb").read_text())
        bundles = [o.get("data", {}) for o in saved["cells"][1]["outputs"] if "data" in o]
        assert bundles and not any(
            "application/vnd.jupyter.widget-view+json" in b for b in bundles
        ), bundles
        assert any("[2] replica 2 step 0" in "".join(b.get("text/plain", "")) for b in bundles)
        shutil.copyfile(tmp_path / "tabs.ipynb", tmp_path / "saved.ipynb")
        with lab.open("saved.ipynb") as page:  # a fresh kernel: none of the widgets' models
            # (JupyterLab also restores tabs.ipynb, hidden behind it: look in the visible one)
            outputs = page.page.locator(".jp-NotebookPanel:visible .jp-OutputArea")
            outputs.get_by_text("[2] ✗ failed").first.wait_for(state="visible", timeout=60_000)
            shown = _chosen_panel(page, 1)
            assert "replica 2 step 0" in shown and "ValueError" in shown, shown
            _shoot(page, tmp_path, "tabs-saved-notebook")
    assert_processes_gone(started, deadline_s=30)
