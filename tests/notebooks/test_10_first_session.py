"""notebooks/10-first-session.ipynb: a new user's first session, as they see it.

Progress bars on the engines, a failure inside a collective (cause first), the dashboard
during a ~20 s training cell, `%dist stop`. In JupyterLab (where a browser is installed) the
checks include what the page draws: the bars at 100 %, the error as shown, the dashboard
drawn while the training runs (screenshot `10-first-session-during-training.png`).
tests/browser/test_notebook7.py runs the same notebook, with the same checks, in Notebook 7.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from typing import Any

import pytest

from nbdist.testing.jupyterlab import LabPage
from nbdist.testing.kernels import cell_text, find_cell
from tests.notebooks.conftest import screenshots_folder

pytestmark = pytest.mark.cluster

NAME = "10-first-session"
IMAGES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "images"
UPDATE_IMAGES = os.environ.get("NBDIST_UPDATE_DOC_IMAGES") == "1"  # else the tree stays clean
# With NBDIST_SCREENSHOTS=folder NBDIST_UPDATE_DOC_IMAGES=1, these cells' pictures go to docs/.
DOC_IMAGES = {'desc="warming up"': "notebook-progress.png",
              "1 / 0": "notebook-collective-error.png"}  # fmt: skip
ANSI = re.compile(r"\x1b\[[0-9;]*m")
INTERNAL = ("nbdist/collectives/", "core/reduce/rules.py", "multi_worker.py", "distributed_c10d",
            "_pytree", "site-packages", "GLHF", "Connection closed by peer")  # fmt: skip


def _count(text: str, total: int) -> int:
    """The largest `N/total` a progress bar shows in `text` (0 when none)."""
    return max((int(n) for n in re.findall(rf"(\d+)/{total}\b", text)), default=0)


def watch_training(shots: pathlib.Path, suffix: str = "") -> Any:
    """A `during` hook: once the training bar is a third of the way, check the dashboard is
    drawn (a widget with a size, no error) and screenshot the notebook while it trains."""

    def during(page: LabPage) -> None:
        page.wait_until(
            "() => { const cells = window.jupyterapp.shell.currentWidget.content.widgets;"
            " const c = cells.find(c => c.model.sharedModel.source.includes('desc=\"training\"'));"
            " const m = c && c.node.innerText.match(/(\\d+)\\/200/g);"
            " return !!m && Math.max(...m.map(s => parseInt(s))) >= 60; }",
            timeout=300,
        )
        board = page.page.evaluate(
            "() => { const cells = window.jupyterapp.shell.currentWidget.content.widgets;"
            " const c = cells.find(c => c.model.sharedModel.source.includes('nd.dashboard()'));"
            " const w = c.node.querySelector('.jp-OutputArea-output .jupyter-widgets');"
            " const r = w && w.getBoundingClientRect();"
            " return {drawn: !!w, height: r ? r.height : 0,"
            "         text: c.node.querySelector('.jp-OutputArea').innerText}; }"
        )
        assert board["drawn"] and board["height"] > 100, board
        assert "Error displaying widget" not in board["text"], board["text"]
        page.screenshot_notebook(shots / f"{NAME}{suffix}-during-training.png")

    return during


def check_first_session(nb: Any) -> None:
    """What the notebook must show, in JupyterLab, Notebook 7 or nbclient (`rendered`, what
    the page drew, only in a browser)."""
    warm = find_cell(nb, 'desc="warming up"')
    assert "[0] replica 0: 100 ones summed over 2 replicas" in cell_text(warm)
    assert "[1] replica 1: 100 ones summed over 2 replicas" in cell_text(warm)

    failing = find_cell(nb, "1 / 0")
    errors = [o for o in failing.outputs if o.output_type == "error"]
    assert len(errors) == 1, failing.outputs
    shown = ANSI.sub("", "\n".join(errors[0].traceback))
    first = errors[0].evalue.splitlines()[0]
    assert "ZeroDivisionError" in first and "1" in first, first  # the cause first
    assert "1 / 0" in shown  # the user's own line
    assert re.search(r"replica 0\b.*released", shown), shown  # the waiting one: one line
    assert shown.index("ZeroDivisionError") < shown.index("released"), shown
    for name in INTERNAL:
        assert name not in shown, f"{name!r} in the error:\n{shown}"
    assert "replica 1 is fine; total is still 100" in cell_text(find_cell(nb, "is fine"))

    board = find_cell(nb, "nd.dashboard()")
    views = [o for o in board.outputs if "application/vnd.jupyter.widget-view+json" in
             o.get("data", {})]  # fmt: skip
    assert views, board.outputs
    training = cell_text(find_cell(nb, 'desc="training"'))
    assert re.search(r"\[0\] replica 0: loss \d+\.\d+ after 200 steps", training), training
    assert re.search(r"\[1\] replica 1: loss \d+\.\d+ after 200 steps", training), training
    assert "loss logged at 200 steps, by replicas [0, 1]" in cell_text(find_cell(nb, "refresh"))
    assert "no engine is left" in cell_text(find_cell(nb, "%dist stop"))

    rendered = {marker: find_cell(nb, marker).metadata.get("rendered")
                for marker in ('desc="warming up"', "1 / 0", 'desc="training"')}  # fmt: skip
    if rendered["1 / 0"] is None:
        return  # nbclient: nothing was drawn
    for marker in ('desc="warming up"', 'desc="training"'):  # one bar widget each, full
        assert find_cell(nb, marker).metadata["progress_bars"] == [100.0], marker
    assert _count(rendered['desc="warming up"'], 50) == 50, rendered['desc="warming up"']
    assert "100%" in rendered['desc="warming up"']
    assert _count(rendered['desc="training"'], 200) == 200, rendered['desc="training"']
    error = rendered["1 / 0"]
    lines = [line for line in error.splitlines() if line.strip()]
    assert "ZeroDivisionError" in lines[0], error  # the first line on screen names the cause
    assert len(lines) < 15, f"{len(lines)} lines:\n{error}"


@pytest.mark.timeout(600)
def test_first_session(execute_notebook, tmp_path):
    shots = screenshots_folder(tmp_path)
    nb = execute_notebook(NAME, during=watch_training(shots))
    check_first_session(nb)
    if UPDATE_IMAGES and (shots / NAME).is_dir():  # docs/notebooks.md's pictures
        for marker, image in DOC_IMAGES.items():
            index = nb.cells.index(find_cell(nb, marker))
            shutil.copyfile(shots / NAME / f"cell-{index:02d}.png", IMAGES / image)
