"""The abstract ClusterResolver and the address helpers of nbdist.cluster_resolver.base."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import ClusterResolver, ClusterSpec
from nbdist.cluster_resolver.base import (
    format_address,
    format_master_url,
    split_address,
    validate_port,
)
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import fake_gpu_count


class _OneWorker(ClusterResolver):
    def cluster_spec(self):
        return ClusterSpec({"worker": ["localhost:2222"]})

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        return format_master_url("localhost:2222", rpc_layer)


def test_cluster_resolver_is_abstract():
    with pytest.raises(TypeError):
        ClusterResolver()  # type: ignore[abstract]


def test_cluster_resolver_inherited_properties_and_setters():
    resolver = _OneWorker()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.environment == ""
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 0, "grpc"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 0, "grpc")
    assert resolver.master(rpc_layer="grpc") == "grpc://localhost:2222"


@pytest.mark.parametrize(("count", "expected"), [(0, {}), (1, {"GPU": 1}), (8, {"GPU": 8})])
def test_num_accelerators_counts_local_gpus_like_tensorflow(monkeypatch, count, expected):
    fake_gpu_count(monkeypatch, count)
    assert _OneWorker().num_accelerators() == expected
    assert _OneWorker().num_accelerators("worker", 0, config_proto=None) == expected


def test_format_master_url():
    assert format_master_url("h:1") == "h:1"
    assert format_master_url("h:1", None) == "h:1"
    assert format_master_url("h:1", "") == "h:1"
    assert format_master_url("h:1", "grpc") == "grpc://h:1"


@pytest.mark.parametrize(("value", "port"), [(1, 1), ("2222", 2222), (" 80 ", 80), (65535, 65535)])
def test_validate_port_accepts(value, port):
    assert validate_port(value, variable="X") == port


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, r"MASTER_PORT has port 0, outside the valid range 1\.\.65535"),
        (65536, r"MASTER_PORT has port 65536, outside"),
        ("70000", r"MASTER_PORT has port '70000', outside"),
        ("http", r"MASTER_PORT has port 'http', which is not an integer"),
        ("-5", r"MASTER_PORT has port '-5', which is not an integer"),
        (True, r"MASTER_PORT has port True"),
        (22.5, r"MASTER_PORT has port 22.5, which is not an integer"),
        (None, r"MASTER_PORT has port None"),
    ],
)
def test_validate_port_rejects_and_names_the_variable(value, match):
    with pytest.raises(ClusterConfigError, match=match):
        validate_port(value, variable="MASTER_PORT")


def test_split_address():
    assert split_address("worker0.example.com:2222", variable="X") == ("worker0.example.com", 2222)
    assert split_address("10.0.0.1:80", variable="X") == ("10.0.0.1", 80)
    assert split_address("[::1]:2222", variable="X") == ("::1", 2222)


@pytest.mark.parametrize(
    ("address", "match"),
    [
        ("localhost", r"VAR has address 'localhost', which is not 'host:port'"),
        (":2222", r"not 'host:port'"),
        ("host:", r"port ''"),
        ("host:abc", r"VAR \(address 'host:abc'\) has port 'abc'"),
        ("host:0", r"port '0', outside"),
        ("my host:22", r"not 'host:port'"),
        ("", r"addresses are strings"),
        (2222, r"VAR has address 2222"),
    ],
)
def test_split_address_rejects(address, match):
    with pytest.raises(ClusterConfigError, match=match):
        split_address(address, variable="VAR")


def test_format_address():
    assert format_address("node1", 8888, variable="port_base") == "node1:8888"
    assert format_address("::1", "80", variable="port_base") == "[::1]:80"
    with pytest.raises(ClusterConfigError, match=r"port_base has port 70000"):
        format_address("node1", 70000, variable="port_base")
    with pytest.raises(ClusterConfigError, match=r"port_base: host '' is empty"):
        format_address("", 80, variable="port_base")
