"""The dashboard on in-process strategies: views, straggler, PNG, trace and bad input."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

import nbdist as nd
from nbdist.errors import FileWriteError
from nbdist.widgets import Dashboard

pytest.importorskip("ipywidgets")


pytestmark = pytest.mark.usefixtures("fresh_metrics")  # tests/unit/conftest.py


def _train(strategy, model, steps=12, slow_replica=None, delay=0.05):
    def step(i):
        ctx = nd.get_replica_context()
        rid = ctx.replica_id_in_sync_group
        if rid == slow_replica:
            time.sleep(delay)
        loss = model(torch.ones(2, 8)).pow(2).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for g in grads:
            ctx.all_reduce("mean", g)
        nd.log(step=i, loss=loss.detach())

    for i in range(steps):
        strategy.run(step, args=(i,))


@pytest.fixture
def trained():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    strategy.extended.telemetry.clear()
    with strategy.scope():
        model = torch.nn.Linear(8, 4)
    _train(strategy, model, slow_replica=1)
    board = Dashboard(strategy, live=False, namespace={"model": model})
    yield strategy, model, board
    board.close()


def test_views_show_two_replicas_records_curves_and_placement(trained):
    _, model, board = trained
    data = board.data
    assert [e.replica for e in data.engines] == [0, 1]
    assert set(board.engines.states.values()) == {"alive"}
    param_bytes = {p.numel() * p.element_size() for p in model.parameters()}
    assert param_bytes <= {r.nbytes for r in data.collectives}  # one all-reduce per gradient
    assert set(board.training.curves["loss"]) == {0, 1}
    assert len(board.training.curves["loss"][1][0]) == 12
    held = sum(r["bytes"] for r in data.holdings[0] if r["kind"] == "parameters")
    assert held == sum(p.numel() * p.element_size() for p in model.parameters())
    assert "model" in board.placement.widget.value
    assert len(board.reductions.image.value) > 10_000  # a PNG was drawn


def test_straggler_on_purpose_is_named(trained):
    _, _, board = trained
    assert board.reductions.straggler == 1
    assert "straggler: replica 1" in board.reductions.caption.value
    assert board.reductions.key is not None


def test_unchanged_data_draws_nothing_new(trained):
    _, _, board = trained
    board.refresh()
    assert board.changed[1] is False and board.changed[2] is False


def test_png_export_has_every_panel(trained, tmp_path):
    import matplotlib.image

    _, _, board = trained
    path = board.save(tmp_path / "dashboard.png")
    assert path.stat().st_size > 30_000
    pixels = matplotlib.image.imread(path)[..., :3]
    height = pixels.shape[0]
    # Engines table on top, reductions in the middle, training at the bottom: none blank.
    for band in (pixels[: height // 6], pixels[height // 4 : 3 * height // 4],
                 pixels[4 * height // 5 :]):  # fmt: skip
        assert np.var(band) > 1e-3


def test_export_trace_writes_chrome_trace_events(trained, tmp_path):
    _, _, board = trained
    board.export_trace(tmp_path / "run.json")
    events = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["cat"] == "collective"} == {0, 1}
    assert sum(e["cat"] == "step" for e in events) == 24


def test_save_to_an_unwritable_path_names_it(trained, tmp_path):
    _, _, board = trained
    target = tmp_path / "missing-folder" / "dash.png"
    with pytest.raises(FileWriteError, match="missing-folder") as failed:
        board.save(target)
    assert isinstance(failed.value, OSError)


def test_dashboard_before_any_cluster_shows_the_default_strategy_and_says_how_to_start():
    board = nd.dashboard()
    try:
        assert "%dist start" in board.engines.widget.value
        assert len(board.data.engines) == 1
    finally:
        board.close()


def test_dashboard_refuses_a_bad_target():
    with pytest.raises(TypeError, match=r"strategy or an nd\.Cluster"):
        nd.dashboard(target=42)


def test_live_refresher_updates_while_training_runs():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = torch.nn.Linear(8, 4)
    board = Dashboard(strategy, interval=0.2, namespace={"model": model})
    try:
        first = board.refreshes
        deadline = time.monotonic() + 60
        while board.refreshes < first + 2 and time.monotonic() < deadline:
            _train(strategy, model, steps=2)
        assert board.refreshes >= first + 2
    finally:
        board.close()
    assert not board._thread.is_alive()
