"""SimpleClusterResolver: TensorFlow's example, defaults, setters and bad arguments."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import ClusterSpec, SimpleClusterResolver
from nbdist.errors import ClusterConfigError


def test_simple_resolver_tensorflow_example():
    cluster = ClusterSpec({"worker": ["worker0.example.com:2222", "worker1.example.com:2222"]})
    resolver = SimpleClusterResolver(
        cluster, task_type="worker", task_id=1, num_accelerators={"GPU": 8}, rpc_layer="grpc"
    )
    assert resolver.cluster_spec() is cluster
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.num_accelerators() == {"GPU": 8}
    assert resolver.master("worker", 0) == "grpc://worker0.example.com:2222"
    assert resolver.master("worker", 0, rpc_layer="http") == "http://worker0.example.com:2222"
    assert resolver.master() == "grpc://"  # TF prefixes even an empty master
    assert resolver.environment == ""


def test_simple_resolver_defaults_and_setters():
    resolver = SimpleClusterResolver(ClusterSpec({"ps": ["p:1"]}), master="m:9", environment="g")
    assert resolver.master() == "m:9"
    assert resolver.master("ps") == "m:9"  # a task needs both its type and its id
    assert resolver.num_accelerators() == {}
    assert resolver.environment == "g"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "ps", 0, "grpc"
    assert resolver.master() == "grpc://m:9"
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)


def test_simple_resolver_unknown_task_in_master():
    resolver = SimpleClusterResolver(ClusterSpec({"ps": ["p:1"]}))
    with pytest.raises(ValueError, match=r"No job 'worker'.*\['ps'\]"):
        resolver.master("worker", 0)


def test_simple_resolver_rejects_wrong_types():
    with pytest.raises(TypeError, match=r"needs a ClusterSpec.*got dict.*Wrap it"):
        SimpleClusterResolver({"worker": ["w:1"]})  # type: ignore[arg-type]
    with pytest.raises(ClusterConfigError, match=r"master must be a string.*got int 5"):
        SimpleClusterResolver(ClusterSpec({}), master=5)  # type: ignore[arg-type]
