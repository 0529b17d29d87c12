"""`nd.Cluster`'s arguments and a cluster that is not running: no engines start here.

Bad arguments fail in the constructor with a message naming the fix; the launch plan pins one
GPU per engine; a cluster that never started says how to start it.
"""

from __future__ import annotations

import pytest
import torch

from nbdist.cluster import Cluster, ClusterStoppedError
from nbdist.cluster.launch.plan import make_plan

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"n": 0}, ValueError, ["n=0", "at least 1"]),
        ({"n": -3}, ValueError, ["n=-3"]),
        ({"n": 1.5}, TypeError, ["n must be a whole number"]),
        ({"launcher": "kubernetes"}, ValueError, ["'kubernetes'", "'local'", "'ssh'", "'slurm'"]),
        ({"backend": "mpi"}, ValueError, ["'mpi'", "'auto'", "'gloo'", "'nccl'"]),
        ({"strategy": "central"}, ValueError, ["'central'", "'mirrored'", "'multi_worker'"]),
        ({"strategy": "parameter_server", "n": 1}, ValueError, ["n=1", "leaves no worker"]),
        ({"launcher": "ssh"}, ValueError, ["launcher='ssh'", "needs hosts"]),
        ({"launcher": "ssh", "hosts": "a:2,b:2", "n": 3}, ValueError, ["n=3", "4 engine(s)"]),
        ({"launcher": "mpi", "hosts": "a:2", "gpus": [0]}, ValueError, ["GPU indices", "'none'"]),
        (
            {"launcher": "slurm", "hosts": "a:1,b:2"},
            ValueError,
            ["same number of engines on every node"],
        ),
        ({"n": 2, "launcher_options": {"bogus": 1}}, ValueError, ["['bogus']", "engine_cmd"]),
        ({"n": 2, "launcher_options": ["-p"]}, TypeError, ["launcher_options must be a dict"]),
        ({"hosts": "node1:2"}, ValueError, ["hosts='node1:2'", "launcher='ssh'"]),
        ({"gpus": 2}, TypeError, ["gpus=2", "n=2"]),
        ({"n": 2, "timeout": 0}, ValueError, ["timeout"]),
        ({"n": 2, "heartbeat_period": 0}, ValueError, ["heartbeat_period"]),
    ],
)
def test_constructor_rejects_bad_input(kwargs, error, words):
    with pytest.raises(error) as info:
        Cluster(**kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without GPU")
def test_gpus_all_without_gpu_names_the_fix():
    with pytest.raises(ValueError, match=r"no CUDA GPU.*Cluster\(n=2\)"):
        Cluster(gpus="all")
    with pytest.raises(ValueError, match="nccl"):
        Cluster(n=2, backend="nccl")


def test_gpu_plans_pin_one_gpu_per_engine():
    # What Cluster(...) plans on a machine with GPUs "2" and "3" (CUDA_VISIBLE_DEVICES=2,3).
    plan = make_plan(gpus="all", gpu_ids=("2", "3"))
    assert plan.n == 2 and plan.device_kind == "gpu"
    assert plan.engine_sets() == [
        (1, {"CUDA_VISIBLE_DEVICES": "2"}),
        (1, {"CUDA_VISIBLE_DEVICES": "3"}),
    ]
    assert make_plan(gpus="1", gpu_ids=("2", "3")).gpus == ("3",)
    assert make_plan(n=1, gpu_ids=("0", "1")).gpus == ("0",)
    assert make_plan(gpus="none", n=3, gpu_ids=("0",)).engine_sets() == [(3, {})]
    assert make_plan(gpus=[0], backend="nccl", gpu_ids=("0",)).backend == "nccl"
    with pytest.raises(ValueError, match=r"GPU\(s\) \[4\]"):
        make_plan(gpus=[0, 4], gpu_ids=("0", "1"))
    with pytest.raises(ValueError, match="twice"):
        make_plan(gpus=[1, 1], gpu_ids=("0", "1"))
    with pytest.raises(ValueError, match="only 2 GPU"):
        make_plan(n=3, gpu_ids=("0", "1"))


def test_a_cluster_that_is_not_running_says_so():
    cluster = Cluster(n=2)
    assert not cluster.running and cluster.engines == () and len(cluster.status()) == 0
    with pytest.raises(RuntimeError, match=r"cluster.start\(\)"):
        _ = cluster.strategy
    # issue 23, item 9: an nbdist error naming both ways to start it
    for reach in (lambda: cluster.strategy, lambda: cluster.client, lambda: cluster.pull("x")):
        with pytest.raises(ClusterStoppedError, match=r"stopped.*cluster.start\(\).*%dist start"):
            reach()
    cluster.stop()  # stopping a cluster that never started is fine
    assert "stopped" in repr(cluster)
