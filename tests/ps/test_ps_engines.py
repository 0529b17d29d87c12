"""`nd.Cluster(n=3, strategy="parameter_server", num_ps=1)`: engines as 2 workers and 1 ps, the
test as the chief (as a notebook is). Training to 90 %, a worker engine killed with SIGKILL
mid-training, a fresh engine in its place, then the ps engine killed."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import nbdist as nd
from nbdist.app import ps_training
from nbdist.cluster.launch.processes import pid_alive
from tests.ps.timing import first_work_after

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _steps_and_count(model, counter, iterator):
    loss = ps_training.train_steps(model, iterator, steps=5)
    counter.assign_add(torch.ones(counter.shape))
    return loss


def test_engines_train_survive_a_killed_worker_and_report_a_dead_ps():
    cluster = nd.Cluster(
        n=3, strategy="parameter_server", num_ps=1, timeout=120, collective_timeout=200
    )
    try:
        cluster.start()
        assert cluster.roles == ("worker", "worker", "ps")
        assert cluster.strategy.timeout == 200  # the coordinator's wait (default 300)
        strategy, coordinator = cluster.strategy, cluster.coordinator
        assert isinstance(strategy, nd.ParameterServerStrategy)
        with strategy.scope():
            model = ps_training.build_model()
            counter = nd.Variable(torch.zeros(1000), name="counter")
        iterator = iter(coordinator.create_per_worker_dataset(ps_training.dataset_fn()))
        values = [
            coordinator.schedule(_steps_and_count, args=(model, counter, iterator))
            for _ in range(100)
        ]
        values[8].get()
        killed_at = time.monotonic()
        os.kill(cluster.engines[1].pid, signal.SIGKILL)
        coordinator.join()
        print(f"worker engine killed: training finished {time.monotonic() - killed_at:.2f} s later")
        assert all(v.get().shape == () for v in values)
        count = counter.read_value()
        assert torch.all(count == count[0]) and count[0] >= len(values)
        strategy.pull(model)
        assert ps_training.evaluate(model) >= 0.9

        restarting = time.monotonic()
        cluster.restart_worker(1)
        restarted = time.monotonic() - restarting
        later = [
            coordinator.schedule(_steps_and_count, args=(model, counter, iterator))
            for _ in range(30)
        ]
        work_after = first_work_after(later, worker=1, since=restarting)
        print(f"worker engine restarted in {restarted:.2f} s; work on it after {work_after:.2f} s")
        coordinator.join()
        assert 1 in {v.worker for v in later}, "the restarted worker got no work"

        for _ in range(30):
            coordinator.schedule(_steps_and_count, args=(model, counter, iterator))
        killed_at = time.monotonic()
        os.kill(cluster.engines[2].pid, signal.SIGKILL)
        with pytest.raises(nd.PSUnavailableError, match="/job:ps/task:0"):
            coordinator.join()
        seconds = time.monotonic() - killed_at
        assert seconds < 30
        print(f"ps engine killed: PSUnavailableError after {seconds:.2f} s")
    finally:
        pids = cluster.processes if cluster.running else ()
        cluster.stop()
    assert not [pid for pid in pids if pid_alive(pid)], "processes left behind"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 3, "num_ps": 0}, "at least one ps task"),
        ({"n": 1, "num_ps": 1}, "leaves no worker"),
        ({"n": 3, "num_ps": "1"}, "whole number"),
        ({"n": 3, "gpus": "all"}, "CPU engines"),
        ({"n": 3, "launcher": "mpi"}, "not with launcher='mpi'"),
        ({"launcher": "ssh", "hosts": "a:1,b:1", "num_ps": 2}, "leaves no worker"),
    ],
)
def test_bad_parameter_server_clusters_are_refused_before_starting(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        nd.Cluster(strategy="parameter_server", **kwargs)


def test_num_ps_needs_the_parameter_server_strategy():
    with pytest.raises(ValueError, match="num_ps is for strategy='parameter_server'"):
        nd.Cluster(n=2, num_ps=1)


def test_the_strategy_picks_the_cluster_class_by_name_or_by_position():
    """`Cluster.__new__` takes `strategy` as `__init__` does, by keyword or in its place."""
    from nbdist.cluster.ps_cluster import PSCluster

    assert type(nd.Cluster(n=3, strategy="parameter_server")) is PSCluster
    assert type(nd.Cluster(3, None, None, "local", "auto", "parameter_server")) is PSCluster
    assert type(nd.Cluster(3, None, None, "local", "auto", " Parameter_Server ")) is PSCluster
    assert type(nd.Cluster(2, None, None, "local", "auto", "mirrored")) is nd.Cluster
    assert type(nd.Cluster(2)) is nd.Cluster
    with pytest.raises(ValueError, match="num_ps is for strategy='parameter_server'"):
        nd.Cluster(2, None, None, "local", "auto", "mirrored", num_ps=1)
