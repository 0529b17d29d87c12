"""Calls into one running cluster (2 real CPU engines) over time: a timeout interrupts the
engines, concurrent calls take turns, a waiting call times out by name, `status()` lists the
engines. The cluster is the package's (conftest.py).
"""

from __future__ import annotations

import threading
import time

import psutil
import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import EngineTimeoutError
from nbdist.errors import BusyError
from tests.cluster.replica_functions import TIMEOUT

pytestmark = pytest.mark.cluster


@interactive
def sleep_on_replica_one(seconds):
    import time

    if nd.get_replica_context().replica_id_in_sync_group == 1:
        time.sleep(seconds)
    return "done"


@interactive
def scaled_rank_sum(scale):
    ctx = nd.get_replica_context()
    return float(ctx.all_reduce("sum", torch.tensor(scale * (ctx.replica_id_in_sync_group + 1.0))))


@interactive
def hold_until(path):
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    ctx = nd.get_replica_context()
    return float(ctx.all_reduce("sum", torch.tensor(ctx.replica_id_in_sync_group + 1.0)))


def test_a_timeout_interrupts_the_engines(cluster):
    begin = time.perf_counter()
    with pytest.raises(EngineTimeoutError) as info:
        cluster.strategy.run(sleep_on_replica_one, args=(600,), timeout=2)
    assert isinstance(info.value, TimeoutError) and info.value.pending == (1,)
    assert time.perf_counter() - begin < 30
    # The interrupted engine is idle again and the group is intact.
    assert cluster.strategy.run(sleep_on_replica_one, args=(0,)).values == ("done", "done")


def test_concurrent_runs_take_turns_and_never_mix(cluster):
    """Issue 23: two threads' runs paired each other's collectives ([21.0, 12.0]) or were
    refused as if the cluster were unusable; now they take turns."""
    wrong, errors = [], []
    start = threading.Barrier(2, timeout=TIMEOUT)

    def caller(scale):
        try:
            start.wait()
            for _ in range(4):
                values = list(cluster.strategy.run(scaled_rank_sum, args=(scale,)).values)
                if values != [3.0 * scale] * 2:
                    wrong.append(values)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(s,)) for s in (1.0, 10.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * TIMEOUT)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[:2]
    assert not wrong, wrong


def test_a_waiting_call_times_out_by_name_and_the_cluster_stays_usable(cluster, tmp_path):
    """A second thread's call waits its turn; its timeout covers the wait (`BusyError`, a
    `TimeoutError`, naming the call it waited for), and nothing is sent."""
    flag = tmp_path / "go"
    out = {}
    holder = threading.Thread(
        target=lambda: out.setdefault("held", cluster.strategy.run(hold_until, args=(str(flag),))),
        name="holder",
    )
    holder.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while "busy" not in [row.state for row in cluster.status()]:
            assert time.monotonic() < deadline, "the first call never started"
            holder.join(0.01)
        begin = time.monotonic()
        with pytest.raises(BusyError, match=r"waited 0\.5 s for strategy\.run\(hold_until\)"):
            cluster.strategy.run(scaled_rank_sum, args=(10.0,), timeout=0.5)
        assert 0.4 < time.monotonic() - begin < 10
        with pytest.raises(BusyError, match=r"'holder'.*the cluster is usable"):
            cluster.pull("remembered", timeout=0.5)
    finally:
        flag.touch()
        holder.join(TIMEOUT)
    assert out["held"].values == (3.0, 3.0)
    assert cluster.broken is None
    assert cluster.strategy.run(scaled_rank_sum, args=(10.0,)).values == (30.0, 30.0)


def test_status_lists_alive_engines(cluster):
    rows = cluster.status()
    assert [row.rank for row in rows] == [0, 1]
    assert [row.state for row in rows] == ["alive", "alive"] and rows.alive
    assert [row.device for row in rows] == ["cpu:0", "cpu:0"]
    pids = [row.pid for row in rows]
    assert len(set(pids)) == 2 and all(psutil.pid_exists(pid) for pid in pids)
    assert "replica  engine" in str(rows)
    assert "2 CPU engine(s)" in repr(cluster) and "running" in repr(cluster)
