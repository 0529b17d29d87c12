"""UnionResolver: TensorFlow's example, overrides, merged jobs and conflicts."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import (
    ClusterSpec,
    SimpleClusterResolver,
    TFConfigClusterResolver,
    UnionResolver,
)
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import TF_CONFIG_CHIEF_WORKER_PS, set_tf_config


def _workers_and_ps():
    workers = SimpleClusterResolver(
        ClusterSpec({"worker": ["worker0.example.com:2222", "worker1.example.com:2222"]}),
        task_type="worker",
        task_id=1,
        rpc_layer="grpc",
        environment="",
        num_accelerators={"GPU": 2},
    )
    servers = SimpleClusterResolver(
        ClusterSpec({"ps": ["ps0.example.com:2222", "ps1.example.com:2222"]}),
        task_type="ps",
        task_id=0,
        rpc_layer="http",
    )
    return workers, servers


def test_union_tensorflow_example():
    workers, servers = _workers_and_ps()
    union = UnionResolver(workers, servers)
    assert union.cluster_spec().as_dict() == {
        "worker": ["worker0.example.com:2222", "worker1.example.com:2222"],
        "ps": ["ps0.example.com:2222", "ps1.example.com:2222"],
    }
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 1, "grpc")
    assert union.environment == ""
    assert union.num_accelerators() == {"GPU": 2}
    assert union.master() == "grpc://"  # the first resolver's master (empty), with its layer
    assert union.master("ps", 1) == "ps1.example.com:2222"
    assert union.master("ps", 1, rpc_layer="grpc") == "grpc://ps1.example.com:2222"


def test_union_overrides_including_zero_task_id():
    workers, servers = _workers_and_ps()
    union = UnionResolver(workers, servers, task_type="ps", task_id=0, rpc_layer="tcp")
    assert (union.task_type, union.task_id, union.rpc_layer) == ("ps", 0, "tcp")
    assert union.master("ps", 0) == "tcp://ps0.example.com:2222"
    union.task_type, union.task_id, union.rpc_layer = None, None, None
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 1, "grpc")


def test_union_gpu_override_of_tf_config(monkeypatch):
    set_tf_config(monkeypatch, TF_CONFIG_CHIEF_WORKER_PS)
    tf_config = TFConfigClusterResolver()
    gpu_override = SimpleClusterResolver(tf_config.cluster_spec(), num_accelerators={"GPU": 1})
    union = UnionResolver(gpu_override, tf_config)
    assert union.num_accelerators() == {"GPU": 1}
    # Same job in both, both as lists: concatenated, as in TF.
    assert union.cluster_spec().num_tasks("worker") == 4


def test_union_concatenates_lists_and_merges_sparse_jobs():
    a = SimpleClusterResolver(ClusterSpec({"worker": ["a0:1"], "ps": {1: "p1:1"}}))
    b = SimpleClusterResolver(ClusterSpec({"worker": ["b0:1", "b1:1"], "ps": ["p0:1"]}))
    merged = UnionResolver(a, b).cluster_spec()
    assert merged.as_dict() == {"worker": ["a0:1", "b0:1", "b1:1"], "ps": ["p0:1", "p1:1"]}


def test_union_conflicting_sparse_tasks_are_an_error():
    a = SimpleClusterResolver(ClusterSpec({"worker": {1: "w1:1"}}))
    b = SimpleClusterResolver(ClusterSpec({"worker": ["x0:1", "x1:1"]}))
    with pytest.raises(
        ClusterConfigError,
        match=r"Job 'worker' has task 1 defined by more than "
        r"one resolver",
    ) as info:
        UnionResolver(a, b).cluster_spec()
    assert isinstance(info.value, KeyError)
    assert str(info.value).startswith("Job 'worker'")


def test_union_rejects_bad_arguments():
    workers, _ = _workers_and_ps()
    with pytest.raises(ClusterConfigError, match=r"at least one ClusterResolver; got none"):
        UnionResolver()
    with pytest.raises(TypeError, match=r"argument 1 is ClusterSpec.*not a ClusterResolver"):
        UnionResolver(workers, ClusterSpec({}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unexpected keyword argument\(s\) \['environment'\]"):
        UnionResolver(workers, environment="google")
