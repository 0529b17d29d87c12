"""What JupyterLab shows for errors (issue 12, item 6), in a real JupyterLab and headless Chromium.

One notebook starts 2 engines, runs a failing `%%distribute` cell, a cell that sleeps on the
engines and is interrupted with JupyterLab's interrupt command (the stop button), and
`%dist stop`. Each rendered output is screenshot (under the test's folder; also copied to
docs/images/ with NBDIST_UPDATE_DOC_IMAGES=1) and must contain no nbdist-internal file name.
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
UPDATE_IMAGES = os.environ.get("NBDIST_UPDATE_DOC_IMAGES") == "1"  # else the tree stays clean
INTERNAL = ("magics/core.py", "_cell.py", "calls.py", "supervisor.py", "engines.py", "engine_side",
            "threading.py", "site-packages/nbdist", "/nbdist/")  # fmt: skip
CELLS = [
    "%load_ext nbdist\n%dist start -n 2",
    "%%distribute\nx = 1 / 0",
    "%%distribute\nimport time\nprint('sleeping', flush=True)\ntime.sleep(600)",
    "%dist stop",
]


def _output(page, index: int) -> str:
    return (
        page.page.locator(".jp-Notebook .jp-Cell")
        .nth(index)
        .locator(".jp-OutputArea")
        .inner_text(timeout=30_000)
    )


def _shoot(page, tmp_path, name: str) -> pathlib.Path:
    shot = page.screenshot(tmp_path / f"{name}.png")
    assert shot.stat().st_size > 5_000
    if UPDATE_IMAGES:
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, IMAGES / f"{name}.png")
    return shot


def _assert_clean(text: str) -> None:
    for name in INTERNAL:
        assert name not in text, f"{name!r} shown in:\n{text}"


def test_failing_interrupted_and_stop_cells_show_no_nbdist_frames(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, tmp_path / "errors.ipynb")
    lab = JupyterLab(tmp_path)
    started: tuple[int, ...] = ()
    with lab, lab.open("errors.ipynb") as page:
        page.run_cell(0)
        page.wait_for_text("Started in", timeout=180)
        started = tuple(p.pid for p in psutil.Process().children(recursive=True))

        page.run_cell(1)
        page.wait_for_text("[replicas 0, 1] ZeroDivisionError", timeout=120)
        failing = _output(page, 1)
        _shoot(page, tmp_path, "error-failing-cell")
        _assert_clean(failing)
        assert "x = 1 / 0" in failing

        page.start_cell(2)  # without waiting for it to finish: it sleeps until interrupted
        page.wait_for_text("sleeping", timeout=120)
        page.command("notebook:interrupt-kernel")  # the stop button
        page.wait_for_text("ClusterInterrupted", timeout=60)
        interrupted = _output(page, 2)
        _shoot(page, tmp_path, "error-interrupted-cell")
        _assert_clean(interrupted)

        page.run_cell(3)
        page.wait_for_text("Cluster stopped", timeout=120)
        stopped = _output(page, 3)
        _shoot(page, tmp_path, "error-dist-stop")
        _assert_clean(stopped)
        assert "Event loop stopped" not in stopped
        assert "Output for" not in stopped  # no process's log under the one line
        print(failing, interrupted, stopped, sep="\n----\n")
    assert_processes_gone(started, deadline_s=30)
