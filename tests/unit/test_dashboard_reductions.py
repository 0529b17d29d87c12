"""The reductions view with many records (every record accounted for) and a stuck collective
(who has arrived and who has not), on a real in-process strategy."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import nbdist as nd
from nbdist.telemetry.records import now
from nbdist.telemetry.timeline import STUCK_S
from nbdist.widgets import Dashboard

pytest.importorskip("ipywidgets")


pytestmark = pytest.mark.usefixtures("fresh_metrics")  # tests/unit/conftest.py


def _record(telemetry, count: int) -> None:
    t = now()
    for i in range(count):
        start = t + i * 1e-3
        late = (start, start + 2e-4) if i % 3 else (start + 1e-4, start)
        op = "all_reduce:SUM" if i % 4 else "all_gather"
        telemetry.record_arrivals(op, 4096 * (1 + i % 8), "local", (0, 1), late, start + 5e-4)


def test_a_10k_record_redraw_accounts_for_every_record():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    telemetry = strategy.extended.telemetry
    telemetry.clear()
    _record(telemetry, 10_000)
    board = Dashboard(strategy, live=False, namespace={})
    try:
        view = board.reductions
        assert view.count == 10_000
        assert sum(t["count"] for t in view.totals.values()) == 10_000
        assert view.totals["all_gather"]["count"] == 2_500
        assert view.totals["all_reduce:SUM"]["nbytes"] == sum(
            4096 * (1 + i % 8) for i in range(10_000) if i % 4
        )
        assert "<span class='nd-count'>10000</span> collectives" in view.caption.value
        panels = view._panels
        assert len(panels.waiting.get_paths()) == len(panels.working.get_paths()) == 2 * 200
        assert sum(len(s.get_offsets()) for s in panels.scatters.values()) == 1_000
        assert len(panels.bars.get_paths()) == 2
        assert len(view.image.value) > 10_000
        # 4 to 32 KiB messages: latency-bound, no bandwidth made up from them
        assert not panels.peak.get_visible()
        assert panels.bandwidth.get_title() == "latency-bound: median 0.50 ms"
        assert view.link == "latency-bound (messages under 64 KiB): median 0.50 ms"
        assert view.link in view.caption.value
        assert "MB/s" not in view.caption.value

        # More than the log keeps: the oldest are folded into the totals, none is lost.
        _record(telemetry, 2_345)
        board.refresh()
        assert view.count == 10_000
        assert sum(t["count"] for t in view.totals.values()) == 12_345
        assert sum(t["folded"] for t in view.totals.values()) == 2_345
        assert "+2345 older" in view.caption.value
        # printed, the caption is plain text (no HTML tags), with the same numbers
        lines = view.summary.splitlines()
        assert "<" not in view.summary and ">" not in view.summary, view.summary
        assert lines[0].startswith("10000 collectives (+2345 older, folded into the totals)")
        assert any(line.strip().startswith("all_gather: ") for line in lines[1:]), lines
    finally:
        board.close()


def test_a_collective_waiting_longer_than_stuck_s_names_the_missing_replica():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    strategy.extended.telemetry.clear()
    release = threading.Event()
    results: list = []

    def step():
        ctx = nd.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            assert release.wait(timeout=120), "the test never released replica 1"
        return ctx.all_reduce("sum", torch.ones(2))

    runner = threading.Thread(target=lambda: results.append(strategy.run(step)))
    board = Dashboard(strategy, live=False, namespace={})
    runner.start()
    try:
        pace = threading.Event()  # never set: a timed pause between polls
        deadline = time.monotonic() + STUCK_S + 60
        while "nd-stuck" not in board.reductions.caption.value and time.monotonic() < deadline:
            pace.wait(0.2)
            board.refresh()
        caption = board.reductions.caption.value
        assert "stuck: all_reduce:SUM" in caption
        assert "arrived: replica(s) 0" in caption
        assert "not arrived: <span class='nd-missing'>replica(s) 1</span>" in caption
        assert runner.is_alive()  # replica 0 is still waiting in the all-reduce
    finally:
        release.set()
        runner.join(timeout=60)
    assert not runner.is_alive()
    try:
        assert len(results) == 1
        board.refresh()
        assert "nd-stuck" not in board.reductions.caption.value
        assert "straggler: replica 1" in board.reductions.caption.value
    finally:
        board.close()


def test_cell_starts_are_marked_on_every_replica_row():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    telemetry = strategy.extended.telemetry
    telemetry.clear()
    _record(telemetry, 3)
    telemetry.mark("cell 7")  # what a %%distribute cell does on each engine as it starts
    _record(telemetry, 3)
    board = Dashboard(strategy, live=False, namespace={})
    try:
        assert [mark.label for mark in board.data.marks[0]] == ["cell 7"]
        segments = board.reductions._panels.cells.get_segments()
        assert sorted(round(float(s[0][1] + 0.5)) for s in segments) == [0, 1]  # one per row
        assert all(s[0][0] == s[1][0] > 0 for s in segments)  # vertical, inside the window
    finally:
        board.close()
