"""The JupyterLab + Chromium harness itself: a notebook runs, its output and a widget render."""

from __future__ import annotations

import nbformat
import pytest

from nbdist.testing import assert_processes_gone
from nbdist.testing.jupyterlab import JupyterLab

pytestmark = pytest.mark.slow


def test_notebook_runs_and_widget_renders(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('harness-' + str(6 * 7))"),
        nbformat.v4.new_code_cell(
            "import ipywidgets as w\nw.HTML('<b class=\"probe\">widget-rendered</b>')"
        ),
    ]
    nbformat.write(nb, tmp_path / "probe.ipynb")
    lab = JupyterLab(tmp_path)
    with lab, lab.open("probe.ipynb") as page:
        page.run_all()
        page.wait_for_text("harness-42", timeout=120)
        widget = page.wait_for("b.probe", timeout=120)
        assert widget.inner_text() == "widget-rendered"
        shot = page.screenshot(tmp_path / "probe.png")
        assert shot.stat().st_size > 5_000
        import psutil

        started = tuple(p.pid for p in psutil.Process().children(recursive=True))
        assert started, "the server and its kernel run as our children"
    assert_processes_gone(started, deadline_s=15)
