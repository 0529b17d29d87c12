"""The debugger on replicas in a real JupyterLab (and Notebook 7) and headless Chromium (issue 31).

One notebook starts 2 engines; a `%%distribute` cell stops replica 1 at `breakpoint()`, and
the test types pdb commands into JupyterLab's own input box (the kernel's stdin), as a user
does; then a cell fails on replica 1 and `%dist debug` opens the same prompt in its frames;
then Tab completes a name that exists only on the engines. Each step is screenshot (under the
test's folder; copied to docs/images/ with NBDIST_UPDATE_DOC_IMAGES=1, for
docs/debugging.md).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import nbformat
import psutil
import pytest

from nbdist.testing import assert_processes_gone
from nbdist.testing.jupyterlab import JupyterLab
from nbdist.testing.notebook7 import Notebook7

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

IMAGES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "images"
UPDATE_IMAGES = os.environ.get("NBDIST_UPDATE_DOC_IMAGES") == "1"  # else the tree stays clean
CELLS = [
    "%load_ext nbdist\n%dist start -n 2",
    (
        "%%distribute\n"
        "rank = strategy.cluster_resolver.task_id\n"
        "x = 10 * (rank + 1)\n"
        "if rank == 1:\n"
        "    breakpoint()\n"
        "y = x + 1\n"
        "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(y))), axis=None)\n"
        "(x, y, float(total))"
    ),
    ("%%distribute\ndef scale(a, b):\n    q = a * 2\n    return q / b\nscale(rank + 1, 1 - rank)"),
    "%dist debug",
    "%%distribute\nengine_only_weights = torch.ones(3)",
    "%%distribute\nengine_only_weights.re",
    "%dist stop",
]


def _output(page, index: int) -> str:
    return (
        page.page.locator(".jp-Notebook .jp-Cell")
        .nth(index)
        .locator(".jp-OutputArea")
        .inner_text(timeout=30_000)
    )


def _shoot(page, tmp_path, name: str, index: int) -> pathlib.Path:
    shot = tmp_path / f"{name}.png"
    page.page.locator(".jp-Notebook .jp-Cell").nth(index).screenshot(path=str(shot))
    assert shot.stat().st_size > 5_000
    if UPDATE_IMAGES:
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, IMAGES / f"{name}.png")
    return shot


def _around(page, index: int, completer) -> dict:
    """The page area of cell `index` and the completer's list below it."""
    cell = page.page.locator(".jp-Notebook .jp-Cell").nth(index).bounding_box()
    box = completer.bounding_box()
    top, left = min(cell["y"], box["y"]), min(cell["x"], box["x"])
    bottom = max(cell["y"] + cell["height"], box["y"] + box["height"])
    right = max(cell["x"] + cell["width"], box["x"] + box["width"])
    return {"x": left, "y": top, "width": right - left, "height": bottom - top}


def _type(page, index: int, prompt: str, command: str, then: str) -> None:
    """Answer cell `index`'s input box showing `prompt` with `command`; wait until `then` is
    shown."""
    cell = page.page.locator(".jp-Notebook .jp-Cell").nth(index)
    box = cell.locator(".jp-Stdin").filter(has_text=prompt).locator(".jp-Stdin-input:visible")
    box.last.wait_for(state="visible", timeout=120_000)
    handle = box.last.element_handle()
    handle.fill(command)
    handle.press("Enter")
    handle.wait_for_element_state("hidden", timeout=60_000)  # answered: the next box is new
    page.wait_for_text(then, timeout=120)


@pytest.mark.parametrize("front_end", ["jupyterlab", "notebook7"])
def test_breakpoint_post_mortem_and_completion_in_the_browser(tmp_path, front_end):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, tmp_path / "debugger.ipynb")
    lab = JupyterLab(tmp_path) if front_end == "jupyterlab" else Notebook7(tmp_path)
    suffix = "" if front_end == "jupyterlab" else "-notebook7"
    started: tuple[int, ...] = ()
    with lab, lab.open("debugger.ipynb") as page:
        page.run_cell(0)
        page.wait_for_text("Started in", timeout=180)
        started = tuple(p.pid for p in psutil.Process().children(recursive=True))

        page.start_cell(1)
        _type(page, 1, "(Pdb replica 1)", "p x", "20")
        _type(page, 1, "(Pdb replica 1)", "n", "-> y = x + 1")
        _type(page, 1, "(Pdb replica 1)", "p x, rank", "(20, 1)")
        page.page.locator(".jp-Stdin-input").last.wait_for(state="visible", timeout=60_000)
        _shoot(page, tmp_path, f"debugger-breakpoint{suffix}", 1)
        _type(page, 1, "(Pdb replica 1)", "c", "PerReplica:{0: (10, 11, 32.0), 1: (20, 21, 32.0)}")
        stopped = _output(page, 1)
        assert re.search(r"\(Pdb replica 1\)\s+p x\s+20\s", stopped), stopped

        page.run_cell(2)
        page.wait_for_text("ZeroDivisionError", timeout=120)
        page.start_cell(3)
        _type(page, 3, "(Pdb replica 1)", "p a, b, q", "(2, 0, 4)")
        page.page.locator(".jp-Stdin-input").last.wait_for(state="visible", timeout=60_000)
        _shoot(page, tmp_path, f"debugger-post-mortem{suffix}", 3)
        _type(page, 3, "(Pdb replica 1)", "c", "(Pdb replica 1) c")
        page.wait_for_kernel_idle(timeout=120)
        post_mortem = _output(page, 3)
        assert "-> return q / b" in post_mortem, post_mortem

        page.run_cell(4)
        page.wait_for_kernel_idle(timeout=120)
        if front_end == "jupyterlab":
            _tab_completes_from_the_engines(page, tmp_path)
        page.run_cell(6)
        page.wait_for_text("Cluster stopped", timeout=120)
    assert_processes_gone(started, deadline_s=30)


def _completer_after_tab(page, editor, tries: int = 3):
    """The completer shown by Tab. An engine that does not answer within the completion's
    timeout (a loaded machine) adds nothing and no completer opens: Tab again, as a user
    would, up to `tries` times, each with its own deadline."""
    for attempt in range(tries):
        editor.press("Tab")
        try:
            return page.wait_for(".jp-Completer", timeout=20)
        except Exception:  # Playwright's TimeoutError: Tab again
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _tab_completes_from_the_engines(page, tmp_path) -> None:
    """Tab in a %%distribute cell lists attributes of a tensor that exists only on the
    engines (JupyterLab; the screenshot is docs/images/debugger-completion.png)."""
    editor = page.page.locator(".jp-Notebook .jp-Cell").nth(5).locator(".cm-content")
    editor.click()
    editor.press("Control+End")
    completer = _completer_after_tab(page, editor)
    completer.get_by_text("engine_only_weights.reshape", exact=False).first.wait_for(
        state="visible", timeout=60_000
    )
    shot = tmp_path / "debugger-completion.png"
    page.page.screenshot(path=str(shot), clip=_around(page, 5, completer))
    if UPDATE_IMAGES:
        shutil.copyfile(shot, IMAGES / shot.name)
    editor.press("Escape")
