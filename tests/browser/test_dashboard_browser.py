"""The live dashboard in a real JupyterLab and headless Chromium (issue 9, the browser test).

A notebook starts 2 engines, opens `%dist dashboard`, and runs a `%%distribute` cell that
trains a small model (gradients averaged in backward, two all-reduces and `nd.log` every
step, replica 1 a little slower on purpose) until a flag file exists. While that cell runs,
the test asserts from the rendered page that the dashboard opened on Training, that the
summary line above the tabs moves (step, loss, steps/s, last all-reduce) and never says
"diverge" although each replica trains on its own batches (their losses differ) while the
replica check says the replicas are identical, that the Engines view lists two engines, that
the Reductions chart changes and calls the small messages latency-bound; it clicks through the
views and screenshots each. Then it creates the flag file, waits for the cell to end, stops the
engines, checks that the dashboard's output is now its last picture (a PNG, not an empty
output) and that every process it started is gone.

With NBDIST_UPDATE_DOC_IMAGES=1 the screenshots are also copied to docs/images/dashboard-*.png
(the pictures in docs/dashboards.md); with NBDIST_SHOTS=folder, to that folder. The seconds
from the training cell's start to the first loss curve on the page are printed (not asserted:
no timed tests; benchmarks/bench_dashboard.py measures the refresh period).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import nbformat
import psutil
import pytest

from nbdist.testing import assert_processes_gone
from nbdist.testing.jupyterlab import JupyterLab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

IMAGES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "images"
UPDATE_IMAGES = os.environ.get("NBDIST_UPDATE_DOC_IMAGES") == "1"
SHOTS = os.environ.get("NBDIST_SHOTS")

TRAIN = """%%distribute
import os, time
FLAG = {flag!r}
deadline = time.monotonic() + 120  # never runs for ever, even if the test dies
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005)
target = torch.randn(32, 1)

def step(i):
    ctx = nd.get_replica_context()
    rank = ctx.replica_id_in_sync_group
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1000 * i + rank))
    loss = (model(x) - x @ target).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()  # averages the gradients across the engines (gradient_sync)
    grad_norm = sum(float(p.grad.pow(2).sum()) for p in model.parameters()) ** 0.5
    optimizer.step()
    if rank == 1:
        time.sleep(0.01)  # a small straggler, so the reductions view has one to name
    mean_loss = ctx.all_reduce("mean", loss.detach())
    # Every replica stops at the same step: the flag is reduced with the others' flags.
    done = float(os.path.exists(FLAG) or time.monotonic() > deadline)
    return loss.detach(), mean_loss, grad_norm, ctx.all_reduce("max", torch.tensor(done))

i = 0
while True:
    loss, mean_loss, grad_norm, done = strategy.run(step, args=(i,))
    nd.log(step=i, loss=loss, mean_loss=mean_loss, grad_norm=grad_norm)
    i += 1
    if done.item():
        break
    time.sleep(0.02)
print(f"trained {{i}} steps")
"""

CELLS = ["%load_ext nbdist\n%dist start -n 2", "%dist dashboard", TRAIN, "%dist stop"]

_ENGINE_STATES = (
    "() => Array.from(document.querySelectorAll('.nd-dashboard tr.nd-engine'))"
    ".map(row => row.children[1].textContent)"
)
_IMAGE_SRC = (
    "(i) => { const img = document.querySelectorAll('.nd-dashboard img')[i];"
    " return img && img.naturalWidth > 0 ? img.src : ''; }"
)


def _show_view(page, title: str) -> None:
    """Click the dashboard's tab `title` (navigation happens in the browser)."""
    tab = page.page.locator(".nd-dashboard .lm-TabBar-tab", has_text=title).first
    tab.click(timeout=30_000)
    page.wait_until(
        "(t) => { const tab = document.querySelector("
        "'.nd-dashboard .lm-TabBar-tab.lm-mod-current');"
        " return tab && tab.textContent.includes(t); }",
        title,
        timeout=30,
    )


def _settle(page) -> None:
    """Wait until the header and the reductions caption show the same refresh (their updates
    arrive as separate messages), so a screenshot never mixes two refreshes."""
    page.wait_until(
        "() => { const count = document.querySelector('.nd-dashboard .nd-count');"
        " const header = document.querySelector('.nd-dashboard .widget-html-content');"
        " return count && header"
        " && header.textContent.includes(' ' + count.textContent + ' collectives'); }",
        timeout=60,
    )


def _shoot(page, tmp_path: pathlib.Path, name: str, *, dashboard_only: bool = True) -> None:
    _settle(page)
    path = tmp_path / f"{name}.png"
    if dashboard_only:
        page.page.locator(".nd-dashboard").first.screenshot(path=str(path), timeout=30_000)
    else:
        page.screenshot(path)
    assert path.stat().st_size > 5_000, f"{path} looks empty"
    if SHOTS:
        pathlib.Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, pathlib.Path(SHOTS) / f"{name}.png")
    if UPDATE_IMAGES:
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, IMAGES / f"{name}.png")


_SUMMARY = (
    "() => { const s = document.querySelector('.nd-dashboard .nd-summary');"
    " return s ? s.textContent : ''; }"
)


def _summary_moves(page, before: str) -> str:
    """Wait for the summary line to show another step than `before`; never "diverge"."""
    text = page.wait_until(
        f"(before) => {{ const t = ({_SUMMARY})(); return t.startsWith('step ') && t !== before"
        " && t; }",
        before,
        timeout=60,
    ).json_value()
    assert "diverge" not in text, text
    return text


def _image_index(page, view: str) -> int:
    """The index among the dashboard's images of `view`'s chart (tab order)."""
    return {"Reductions": 0, "Training": 1}[view]


def test_dashboard_updates_in_the_browser_while_training_runs(tmp_path):
    flag = tmp_path / "stop-training"
    nb = nbformat.v4.new_notebook()
    cells = [TRAIN.format(flag=str(flag)) if c is TRAIN else c for c in CELLS]
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, tmp_path / "dashboard.ipynb")
    lab = JupyterLab(tmp_path, start_timeout=180)
    started: tuple[int, ...] = ()
    try:
        with lab, lab.open("dashboard.ipynb", timeout=180) as page:
            page.run_cell(0)
            page.wait_for_text("Started in", timeout=240)
            started = tuple(p.pid for p in psutil.Process().children(recursive=True))

            page.run_cell(1)
            page.wait_for(".nd-dashboard", timeout=120)
            states = page.wait_until(
                f"() => {{ const s = ({_ENGINE_STATES})(); return s.length === 2 && s; }}",
                timeout=60,
            ).json_value()
            assert states == ["alive", "alive"], states
            current = page.page.locator(".nd-dashboard .lm-TabBar-tab.lm-mod-current")
            assert current.first.inner_text().strip() == "Training"  # the view that changes
            empty_curves = page.wait_until(_IMAGE_SRC, 1, timeout=60).json_value()

            page.start_cell(2)  # runs until the flag file exists
            began = time.monotonic()
            page.wait_until(  # the first loss curves on the page
                "([i, before]) => { const img = document.querySelectorAll('.nd-dashboard img')[i];"
                " return img && img.naturalWidth > 0 && img.src !== before; }",
                [1, empty_curves],
                timeout=180,
            )
            print(f"first loss curve on the page {time.monotonic() - began:.1f} s after the cell")
            line = _summary_moves(page, "")
            assert "loss " in line and "steps/s" in line, line
            # the engines' collectives can reach a refresh after their first metrics: the
            # next lines name the last all-reduce too
            named_by = time.monotonic() + 60
            while "last all-reduce" not in line and time.monotonic() < named_by:
                line = _summary_moves(page, line)
            assert "last all-reduce" in line, line
            line = _summary_moves(page, line)
            _shoot(page, tmp_path, "dashboard-first-seconds", dashboard_only=False)
            reductions = _image_index(page, "Reductions")
            first = page.wait_until(_IMAGE_SRC, reductions, timeout=180).json_value()
            first_count = int(page.page.locator(".nd-dashboard .nd-count").first.inner_text())
            # The chart changes while the cell is still running (the flag does not exist yet).
            second = page.wait_until(
                "([i, before]) => { const img = document.querySelectorAll('.nd-dashboard img')[i];"
                " return img && img.naturalWidth > 0 && img.src !== before && img.src; }",
                [reductions, first],
                timeout=120,
            ).json_value()
            assert second != first
            page.wait_until(
                "(n) => Number(document.querySelector('.nd-dashboard .nd-count').textContent) > n",
                first_count,
                timeout=120,
            )
            assert not flag.exists()
            states = page.page.evaluate(_ENGINE_STATES)
            assert len(states) == 2 and set(states) <= {"alive", "busy"}, states

            # Each view while the cell runs, for the docs.
            _show_view(page, "Reductions")
            page.wait_until(  # a fresh picture with a hundred steps or more on it
                "(n) => Number(document.querySelector('.nd-dashboard .nd-count').textContent) > n",
                max(first_count + 100, 600),
                timeout=180,
            )
            page.wait_until(  # replica 1 sleeps 10 ms per step: the others wait for it
                "() => document.querySelector('.nd-dashboard .nd-reductions-caption')"
                ".textContent.includes('straggler: replica 1')",
                timeout=60,
            )
            caption = page.page.locator(".nd-dashboard .nd-reductions-caption").first.inner_text()
            assert "latency-bound (messages under 64 KiB): median " in caption, caption
            assert "MB/s" not in caption  # no bandwidth made up from 4-byte messages
            _shoot(page, tmp_path, "dashboard-reductions")
            page.page.evaluate(  # the notebook from the `%dist dashboard` cell down
                "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
                ".scrollIntoView({block: 'start'})"
            )
            _shoot(page, tmp_path, "dashboard-notebook", dashboard_only=False)
            _show_view(page, "Training")
            page.wait_until(_IMAGE_SRC, _image_index(page, "Training"), timeout=60)
            # The replica check (every 100 optimizer steps on the engines) found the
            # parameters identical; the losses, different on different data, say nothing.
            line = page.wait_until(
                f"() => {{ const t = ({_SUMMARY})(); return t.includes('replicas identical')"
                " && t; }",
                timeout=180,
            ).json_value()
            assert "diverge" not in line, line
            _shoot(page, tmp_path, "dashboard-training")
            _show_view(page, "Engines")
            _shoot(page, tmp_path, "dashboard-engines")
            assert not flag.exists()

            flag.write_text("stop\n")
            page.wait_for_text("trained", timeout=120)
            page.wait_for_kernel_idle(timeout=120)
            _show_view(page, "Engines")
            page.wait_until(  # refreshed after the cell: both engines idle again
                f"() => {{ const s = ({_ENGINE_STATES})();"
                " return s.length === 2 && s.every(x => x === 'alive'); }",
                timeout=60,
            )
            _show_view(page, "Placement")  # what each engine holds, pulled after the cell
            page.wait_until(
                "() => document.querySelectorAll('.nd-dashboard .nd-placement td.nd-bytes')"
                ".length >= 2",
                timeout=60,
            )
            held = page.page.evaluate(
                "() => Array.from(document.querySelectorAll("
                "'.nd-dashboard .nd-placement td.nd-bytes')).map(td => Number(td.textContent))"
            )
            assert held == [(32 * 64 + 64 + 64 + 1) * 4] * 2, held  # the model's float32 bytes
            _shoot(page, tmp_path, "dashboard-placement")

            page.run_cell(3)
            page.wait_for_text("Cluster stopped", timeout=120)
            # The dashboard's output is now its last state as a picture (saved with the
            # notebook), not an empty output.
            page.wait_until(
                "() => !document.querySelector('.nd-dashboard') && (() => {"
                " const out = document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
                ".querySelector('.jp-OutputArea img');"
                " return out && out.naturalWidth >= 700; })()",
                timeout=60,
            )
            # the picture is about as tall as the notebook's view: a taller window for the
            # shot, so that the bars above the notebook cover none of it
            page.page.set_viewport_size({"width": 1400, "height": 1500})
            output = page.page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea")
            output.scroll_into_view_if_needed(timeout=30_000)
            stopped = tmp_path / "dashboard-stopped.png"
            output.screenshot(path=str(stopped), timeout=30_000)
            assert stopped.stat().st_size > 20_000
            folders = ([pathlib.Path(SHOTS)] if SHOTS else []) + ([IMAGES] if UPDATE_IMAGES else [])
            for folder in folders:
                shutil.copyfile(stopped, folder / stopped.name)
    finally:
        flag.write_text("stop\n")  # whatever happened, the training loop ends
    assert_processes_gone(started, deadline_s=30)
