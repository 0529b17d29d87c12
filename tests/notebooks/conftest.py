"""Fixtures for the example notebooks under notebooks/: each is run end to end in a real kernel.

`execute_notebook("01-quickstart")` runs notebooks/01-quickstart.ipynb in a temporary copy of
that folder (so files it writes land there) and returns it executed; tests then assert the
notebook's key results on it (`find_cell`, `cell_text`).

Where Chromium and Playwright are installed (CI installs both) the notebook runs **in
JupyterLab**, as a user runs it: a JupyterLab server of its own (one per notebook), the page in
headless Chromium, "Run All", then the notebook as the page holds it. So every notebook is run
once, and that one run is both its test and its browser test. The page is saved as
a screenshot, `<name>.png` (the whole notebook), into `$NBDIST_SCREENSHOTS` (default: the
test's temporary folder); with NBDIST_SCREENSHOTS set, also `<name>/cell-NN.png` (each code
cell with output). Each code cell's `metadata["rendered"]` then holds what its output area
shows in the browser (widgets drawn), and `metadata["progress_bars"]` how full each
progress-bar widget it draws is (percent). Without a browser (or with
NBDIST_NOTEBOOKS_IN_BROWSER=0) the notebook runs with nbclient instead and no cell has
`rendered`.

Either way the run must: run every cell (no error, except in a cell tagged
`raises-exception`), leave neither the kernel nor any engine running, print no Python warning
or HTML-looking text in a stream (`stream_warts`), and, in the browser, draw every widget (no
"Error displaying widget", no view left "Loading widget...").

`during=` (browser only) is called with the page while the notebook runs, to look at a
long cell before it ends (the dashboard during training).
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import nbformat
import pytest

from nbdist.testing import no_leftover_processes
from nbdist.testing.jupyterlab import JupyterLab, LabPage, chromium_available
from nbdist.testing.kernels import run_notebook, stream_warts

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 240
BROWSER_TIMEOUT_S = 540  # the whole notebook, in the browser (the tests' own limit is 600 s)


def in_browser() -> bool:
    """True when the notebooks run in JupyterLab (a browser is here and not turned off)."""
    return chromium_available() and os.environ.get("NBDIST_NOTEBOOKS_IN_BROWSER") != "0"


def screenshots_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """Where the notebooks' screenshots go: $NBDIST_SCREENSHOTS, else the test's folder."""
    folder = os.environ.get("NBDIST_SCREENSHOTS")
    return pathlib.Path(folder) if folder else tmp_path / "screenshots"


def errors_outside_raises_exception(notebook: Any) -> list[str]:
    """`cell N: Ename: value` for each error output of a cell not tagged `raises-exception`,
    and `cell N: not run` for each code cell that never ran (Run All stops at an error)."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("execution_count") is None:
            found.append(f"cell {index}: not run")
        if "raises-exception" in cell.metadata.get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
    return found


def run_in_lab(
    lab: JupyterLab,
    filename: str,
    shots: pathlib.Path,
    during: Callable[[LabPage], None] | None = None,
    suffix: str = "",
) -> Any:
    """Run the notebook `filename` (in the server's root) in a started server (JupyterLab or
    Notebook 7), take its screenshots (`<stem><suffix>.png`, `<stem><suffix>/cell-NN.png`),
    check its widgets drew, and return it as the page holds it, `metadata["rendered"]` on
    every code cell (and `metadata["progress_bars"]`)."""
    path = pathlib.PurePath(filename)
    with lab.open(filename, timeout=180) as page:
        page.start_all()
        if during is not None:
            during(page)
        page.wait_all(timeout=BROWSER_TIMEOUT_S)
        name = f"{path.stem}{suffix}"
        cells = shots / name if os.environ.get("NBDIST_SCREENSHOTS") else None  # CI: not kept
        page.screenshot_notebook(shots / f"{name}.png", cells_to=cells)
        with page.whole_notebook_in_view():  # every cell drawn, also in Notebook 7
            rendered = page.rendered_outputs()
            bars = page.progress_bars()
            problems = page.widget_problems()
        notebook = nbformat.from_dict(page.notebook_json())
    assert not problems, f"{name}: widgets that did not draw: {problems}"
    assert len(rendered) == len(notebook.cells), (len(rendered), len(notebook.cells))
    for cell, text, filled in zip(notebook.cells, rendered, bars):
        if cell.cell_type == "code":
            cell.metadata["rendered"] = text
            cell.metadata["progress_bars"] = filled
    return notebook


@pytest.fixture
def execute_notebook(tmp_path: pathlib.Path) -> Callable[..., Any]:
    """Run notebooks/<name>.ipynb (in JupyterLab where a browser is installed, else with
    nbclient) in a copy of the folder; return it executed."""

    def execute(
        name: str,
        timeout: float = CELL_TIMEOUT_S,
        during: Callable[[LabPage], None] | None = None,
    ) -> Any:
        source = NOTEBOOKS / f"{name}.ipynb"
        assert source.exists(), f"{source} is missing"
        copy = tmp_path / "notebooks"
        shutil.copytree(NOTEBOOKS, copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        with no_leftover_processes(grace=30):
            if in_browser():
                with JupyterLab(copy) as lab:
                    notebook = run_in_lab(lab, source.name, screenshots_folder(tmp_path), during)
            else:
                notebook = run_notebook(copy / source.name, timeout=timeout)
        errors = errors_outside_raises_exception(notebook)
        assert not errors, f"{name} did not run cleanly:\n" + "\n".join(errors)
        warts = stream_warts(notebook)
        assert not warts, f"{name} printed warnings or raw HTML:\n" + "\n".join(warts)
        return notebook

    return execute
