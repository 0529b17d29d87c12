"""A cluster of its own (2 real CPU engines): stop, restart, and the release of an engine
blocked in a collective; a killed engine is named. Starts engines twice (start, restart).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import Cluster, RemoteError
from nbdist.errors import WorkerLostError
from tests.cluster.replica_functions import TIMEOUT, recall, replica_sums

pytestmark = pytest.mark.cluster


@interactive
def fail_before_collective():
    ctx = nd.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        raise ValueError("replica 1 gives up before the all_reduce")
    return ctx.all_reduce("sum", torch.tensor(1.0))


@interactive
def fail_before_raw_collective():
    import torch.distributed as dist

    if nd.get_replica_context().replica_id_in_sync_group == 1:
        raise ValueError("replica 1 gives up before a raw all_reduce")
    total = torch.ones(1)
    dist.all_reduce(total)  # called directly, not through nbdist
    return total


def test_lifecycle(tmp_path, monkeypatch):
    from nbdist.testing import assert_processes_gone

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    begin = time.perf_counter()
    with Cluster(n=2, timeout=90.0) as cluster:
        print(f"\nCluster start to ready: {time.perf_counter() - begin:.2f} s")
        cluster.strategy.timeout = TIMEOUT
        first_pids = cluster.processes
        assert {row.pid for row in cluster.status()} <= set(first_pids)
        # Replica 1 fails while replica 0 waits for it in a collective: replica 0 must be
        # released quickly (not after the 300 s collective timeout), and the group is formed
        # again (Note [Cluster health] in nbdist.cluster.supervisor).
        begin = time.perf_counter()
        with pytest.raises(RemoteError) as info:
            cluster.strategy.run(fail_before_collective)
        assert time.perf_counter() - begin < 30
        error = info.value
        assert error.replicas == (0, 1) and error.first.replica == 1
        assert error.first.ename == "ValueError" and error.failures[0].secondary
        assert "replica 1 gives up" in error.failures[0].evalue  # replica 0 names the cause
        assert "formed again" in str(error) and cluster.broken is None
        assert cluster.strategy.run(replica_sums)[2].values == (0, 1)
        cluster.restart()
        assert cluster.broken is None
        # fresh engines; only the engine zygote that forked them stays (it keeps its imports)
        kept = set(cluster.processes) & set(first_pids)
        assert all(
            "_zygote_main" in " ".join(psutil.Process(pid).cmdline())
            and psutil.Process(pid).name() != "nbdist-engine"
            for pid in kept
        ), kept
        assert len(kept) <= 1
        assert_processes_gone(tuple(set(first_pids) - kept))
        assert cluster.strategy.run(replica_sums)[2].values == (0, 1)
        with pytest.raises(RemoteError, match="name 'remembered' is not defined"):  # fresh
            cluster.strategy.run(recall)
        # The same with a torch.distributed call of the user's own (Note [Raw collectives]).
        begin = time.perf_counter()
        with pytest.raises(RemoteError) as info:
            cluster.strategy.run(fail_before_raw_collective)
        assert time.perf_counter() - begin < 30
        assert info.value.first.replica == 1 and "raw all_reduce" in info.value.first.evalue
        assert info.value.replicas == (0, 1) and cluster.broken is None
        assert cluster.strategy.run(replica_sums)[2].values == (0, 1)
        second_pids = cluster.processes
        # An engine killed between calls: the next call names it instead of waiting.
        victim = cluster.engines[1]
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while cluster.status().alive:
            assert time.monotonic() < deadline, "status never showed the killed engine"
            time.sleep(0.05)  # polling the status under a deadline
        assert [row.state for row in cluster.status()] == ["alive", "dead"]
        with pytest.raises(WorkerLostError, match=r"replica\(s\) \[1\] are dead.*restart\(\)"):
            cluster.strategy.run(replica_sums)
    assert not cluster.running and cluster.engines == ()
    assert_processes_gone(second_pids)
