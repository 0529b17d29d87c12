"""The dashboard's typed data (one `DashboardData` built by one builder from either source),
its live summary line, its refresh pace, the latency-bound label, and the picture it leaves
when it freezes."""

from __future__ import annotations

import time

import pytest
import torch

import nbdist as nd
from nbdist.telemetry.metrics import MetricRecord
from nbdist.telemetry.records import CollectiveRecord, ReplicaCheck, StepRecord, now
from nbdist.widgets import Dashboard
from nbdist.widgets._data import DashboardData, EngineRow, build_data
from nbdist.widgets.reductions import ReductionsView
from nbdist.widgets.summary import summary_text

pytest.importorskip("ipywidgets")

pytestmark = pytest.mark.usefixtures("fresh_metrics")  # tests/unit/conftest.py


def _train_on_different_data(strategy, model, steps: int) -> None:
    """Each replica trains on its own batches (as with a distributed dataset): their losses
    differ at every step while their parameters stay identical."""

    def step(i):
        ctx = nd.get_replica_context()
        rid = ctx.replica_id_in_sync_group
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * i + rid)) * (1 + rid)
        loss = model(x).pow(2).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p.sub_(0.01 * ctx.all_reduce("mean", g))
        nd.log(step=i, loss=loss.detach())

    for i in range(steps):
        strategy.run(step, args=(i,))


@pytest.fixture
def board():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    strategy.extended.telemetry.clear()
    with strategy.scope():
        model = torch.nn.Linear(8, 4)
    _train_on_different_data(strategy, model, steps=6)
    board = Dashboard(strategy, live=False, namespace={"model": model})
    yield board
    board.close()


def test_data_is_named_records(board):
    data = board.data
    assert isinstance(data, DashboardData)
    assert all(isinstance(e, EngineRow) for e in data.engines)
    assert all(isinstance(r, CollectiveRecord) for r in data.collectives)
    assert all(isinstance(s, StepRecord) for s in data.steps)
    assert all(isinstance(m, MetricRecord) for m in data.metrics)
    assert {m.replica for m in data.metrics} == {0, 1}
    assert data["metrics"] is data.metrics  # code written for the dict keeps working
    with pytest.raises(KeyError):
        data["no such field"]


def test_one_builder_for_both_sources(board):
    """What an engine sends (`Telemetry.snapshot()` plus its metric log), built by the same
    builder, is what the in-process source shows."""
    telemetry = board.source.strategy.extended.telemetry
    records = nd.telemetry.metrics.metric_log().records()
    part = {"telemetry": telemetry.snapshot(), "metrics": records, "holdings": [],
            "memory": None}  # fmt: skip
    built = build_data(board.data.engines, {0: part})
    assert built.collectives == board.data.collectives
    assert built.steps == board.data.steps
    assert built.metrics == board.data.metrics


def test_losses_that_differ_on_different_data_never_say_diverge(board):
    losses = board.training.curves["loss"]
    assert losses[0][1] != losses[1][1]  # the replicas' losses differ at every step
    assert "diverge" not in summary_text(board.data)
    assert "diverge" not in board.line.value
    assert "mean of 2 replicas" in board.line.value
    failed = DashboardData(metrics=board.data.metrics,
                           replica_check=ReplicaCheck(time.time(), False, "differ"))  # fmt: skip
    assert "⚠ replicas diverge" in summary_text(failed)
    passed = DashboardData(metrics=board.data.metrics,
                           replica_check=ReplicaCheck(time.time(), True))  # fmt: skip
    assert "replicas identical" in summary_text(passed)


def test_summary_line_shows_step_loss_rate_and_last_all_reduce(board):
    text = summary_text(board.data)
    assert board.summary == text  # printed: plain text
    assert text.startswith("step 5 · loss ")
    assert " steps/s" in text
    assert "last all-reduce " in text and " ms (" in text
    assert board.tabs.selected_index == 2  # opens on Training, the view that changes


def test_pace_counts_cpu_time_not_a_loaded_machines_wall_time(board):
    """A refresh that took 0.9 s of wall time but 0.1 s of CPU (a loaded machine) is followed
    by the next one 1 s after it began, not 4.5 s (0.9 s / 20 %)."""
    board.source.in_process = False  # as for engines: 20 % of a core
    board.last_refresh_s, board.last_refresh_cpu_s = 0.9, 0.1
    assert board._period() == pytest.approx(1.0)
    board.last_refresh_s, board.last_refresh_cpu_s = 0.5, 0.5  # costly: 20 % of a core
    assert board._period() == pytest.approx(2.5)


def test_large_messages_show_a_bandwidth_small_ones_latency_bound():
    start = now()
    records = [
        CollectiveRecord("all_reduce:SUM", 4, "gloo", (0, 1), start + i, 4e-4, (0.0, 0.0))
        for i in range(5)
    ] + [
        CollectiveRecord("all_reduce:SUM", 1 << 20, "gloo", (0, 1), start + 5, 0.01, (0.0, 0.0))
    ]
    view = ReductionsView()
    view.update(DashboardData(collectives=records[:5]))
    assert view._panels.bandwidth.get_title() == "latency-bound: median 0.40 ms"
    assert not view._panels.peak.get_visible()
    view.update(DashboardData(collectives=records))
    title = view._panels.bandwidth.get_title()
    assert title == "peak 105 MB/s (≥ 64 KiB) · latency-bound: median 0.40 ms", title
    assert view._panels.peak.get_visible()
    assert "peak 105 MB/s" in view.summary


def test_freeze_leaves_the_last_state_as_a_picture(board):
    shown = board.data
    board.freeze()
    assert board.frozen and board._stop.is_set()
    header, picture = board.children
    assert "stopped at" in header.value
    assert "nd-final" in picture._dom_classes
    assert picture.value[:8] == b"\x89PNG\r\n\x1a\n" and len(picture.value) > 20_000
    assert board.refresh() is shown  # nothing refreshes any more
    board.freeze()  # twice is fine
