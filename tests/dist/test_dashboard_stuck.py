"""A collective stuck across 2 real gloo workers: the reductions view names who has not arrived.

Worker 1 holds back its all_reduce until the test has seen the stuck note; worker 0 writes
what its telemetry marks as in progress (what an engine's feed sends) to a file while it waits.
The test merges the workers' marks as the dashboard does for engines and draws the view.
"""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from nbdist.telemetry.timeline import STUCK_S
from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from nbdist.widgets._data import DashboardData, _merge_pending
from nbdist.widgets.reductions import ReductionsView
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist
pytest.importorskip("ipywidgets")

WORKER = worker_source("dashboard_stuck")


def _pending(folder, rank):
    path = folder / f"pending{rank}.pkl"
    return pickle.loads(path.read_bytes()) if path.exists() else []


def test_stuck_all_reduce_names_the_worker_that_has_not_arrived(tmp_path):
    port = free_port()
    envs = [{**torchrun_env(rank, 2, port), "STUCK_DIR": str(tmp_path)} for rank in range(2)]
    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(run_workers(WORKER, envs, timeout=150, fail_fast=True))
    )
    runner.start()
    view = ReductionsView()
    pace = threading.Event()  # never set: a timed pause between polls
    try:
        deadline = time.monotonic() + STUCK_S + 90
        while "nd-stuck" not in view.caption.value and time.monotonic() < deadline:
            assert runner.is_alive(), "the workers ended before the collective was stuck"
            pace.wait(0.2)
            pending = _merge_pending({r: _pending(tmp_path, r) for r in (0, 1)}, [0, 1])
            view.update(DashboardData(pending=pending))
        caption = view.caption.value
        assert "stuck: all_reduce" in caption
        assert "arrived: replica(s) 0" in caption
        assert "not arrived: <span class='nd-missing'>replica(s) 1</span>" in caption
    finally:
        (tmp_path / "release").touch()
        runner.join(timeout=150)
    assert not runner.is_alive()
    assert_all_ok(results)
    assert [r.result for r in results] == [8.0, 8.0]
    pending = _merge_pending({r: _pending(tmp_path, r) for r in (0, 1)}, [0, 1])
    assert pending == []
    view.update(DashboardData(pending=pending))
    assert "nd-stuck" not in view.caption.value
