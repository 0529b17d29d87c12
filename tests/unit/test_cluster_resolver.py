"""Tests of nbdist.cluster_resolver: every resolver, every method, every malformed input."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

import nbdist.cluster_resolver as cr
from nbdist.cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    SimpleClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
    TorchrunClusterResolver,
    UnionResolver,
    resolve_cluster,
)
from nbdist.cluster_resolver.base import (
    format_address,
    format_master_url,
    split_address,
    validate_port,
)
from nbdist.cluster_resolver.slurm import expand_hostlist, expand_tasks_per_node
from nbdist.errors import ClusterConfigError, NbdistError

LAUNCH_VARS = [
    "TF_CONFIG",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
]

# TensorFlow's documented multi-worker example: a chief, two workers and a parameter server.
TF_CONFIG_CHIEF_WORKER_PS = {
    "cluster": {
        "chief": ["host0:2222"],
        "worker": ["host1:2222", "host2:2222"],
        "ps": ["host3:2222"],
    },
    "task": {"type": "worker", "index": 1},
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Every test starts outside any launcher; CUDA_VISIBLE_DEVICES is restored afterwards."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")


def set_tf_config(monkeypatch, config) -> None:
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


def set_slurm(monkeypatch, **variables: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def fake_gpu_count(monkeypatch, count: int) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# -- the package ---------------------------------------------------------------------------------


def test_package_exports_exactly_the_public_names():
    assert sorted(cr.__all__) == sorted(
        [
            "ClusterResolver",
            "ClusterSpec",
            "SimpleClusterResolver",
            "SlurmClusterResolver",
            "TFConfigClusterResolver",
            "TorchrunClusterResolver",
            "UnionResolver",
            "resolve_cluster",
        ]
    )
    for name in cr.__all__:
        assert getattr(cr, name) is not None


def test_no_module_imports_torch_at_import_time():
    package = pathlib.Path(cr.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: torch may be imported inside functions
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path.name


def test_errors_are_nbdist_errors_and_the_builtins_tensorflow_raises():
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec(["not", "a", "dict"])
    assert isinstance(info.value, (NbdistError, ValueError, TypeError))
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


# -- ClusterSpec ---------------------------------------------------------------------------------


def test_cluster_spec_dense_jobs():
    spec = ClusterSpec({"worker": ["w0:2222", "w1:2222", "w2:2222"], "ps": ["p0:2222", "p1:2222"]})
    assert spec.jobs == ["worker", "ps"]
    assert spec.num_tasks("worker") == 3
    assert spec.task_indices("ps") == [0, 1]
    assert spec.task_address("worker", 2) == "w2:2222"
    assert spec.job_tasks("ps") == ["p0:2222", "p1:2222"]
    assert spec.as_dict() == {
        "worker": ["w0:2222", "w1:2222", "w2:2222"],
        "ps": ["p0:2222", "p1:2222"],
    }
    assert bool(spec)


def test_cluster_spec_sparse_job_has_holes_like_tensorflow():
    spec = ClusterSpec({"worker": {1: "w1:2222", 3: "w3:2222"}, "ps": ["p0:2222"]})
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [1, 3]
    assert spec.job_tasks("worker") == [None, "w1:2222", None, "w3:2222"]
    assert spec.as_dict() == {"worker": {1: "w1:2222", 3: "w3:2222"}, "ps": ["p0:2222"]}
    assert spec.task_address("worker", 3) == "w3:2222"


def test_cluster_spec_dense_dict_becomes_a_list_and_json_keys_are_indices():
    spec = ClusterSpec({"worker": {"1": "b:1", "0": "a:1"}})
    assert spec.as_dict() == {"worker": ["a:1", "b:1"]}
    assert ClusterSpec({"worker": ("a:1",)}).as_dict() == {"worker": ["a:1"]}


def test_cluster_spec_empty_job_and_empty_cluster():
    spec = ClusterSpec({"worker": []})
    assert spec.num_tasks("worker") == 0
    assert spec.job_tasks("worker") == []
    assert spec.as_dict() == {"worker": {}}
    empty = ClusterSpec({})
    assert not empty
    assert empty.jobs == []
    assert repr(empty) == "ClusterSpec({})"


def test_cluster_spec_copy_sorts_jobs_like_tensorflow():
    original = ClusterSpec({"worker": ["w:1"], "chief": ["c:1"]})
    copy = ClusterSpec(original)
    assert copy.jobs == ["chief", "worker"]
    assert copy == original
    assert copy is not original


def test_cluster_spec_equality_and_repr():
    a = ClusterSpec({"worker": ["w0:1"], "ps": ["p0:1"]})
    assert a == ClusterSpec({"ps": ["p0:1"], "worker": ["w0:1"]})
    assert a == {"worker": ["w0:1"], "ps": ["p0:1"]}
    assert a == {"worker": {0: "w0:1"}, "ps": ["p0:1"]}
    assert a != ClusterSpec({"worker": ["w0:1"]})
    assert a != {"worker": 5}
    assert a != "worker"
    assert repr(a) == "ClusterSpec({'ps': ['p0:1'], 'worker': ['w0:1']})"
    with pytest.raises(TypeError):
        hash(a)


def test_cluster_spec_unknown_job_names_it_and_the_valid_ones():
    spec = ClusterSpec({"worker": ["w0:1"], "ps": ["p0:1"]})
    for method in (spec.num_tasks, spec.task_indices, spec.job_tasks):
        with pytest.raises(ClusterConfigError, match=r"No job 'chief'.*\['worker', 'ps'\]"):
            method("chief")
    with pytest.raises(ValueError, match=r"No job 'chief'.*\['worker', 'ps'\]"):
        spec.task_address("chief", 0)


def test_cluster_spec_unknown_index_names_it_and_the_valid_ones():
    spec = ClusterSpec({"worker": {0: "a:1", 4: "b:1"}})
    with pytest.raises(ValueError, match=r"'worker' has no task with index 2.*\[0, 4\]"):
        spec.task_address("worker", 2)
    with pytest.raises(ValueError, match=r"no task with index \[0\]"):
        spec.task_address("worker", [0])


@pytest.mark.parametrize(
    ("cluster", "match"),
    [
        (["w:1"], r"needs a dict.*got list"),
        ("worker", r"needs a dict.*got str"),
        ({"worker": "w0:1"}, r"tasks of job 'worker' must be a list.*got str"),
        ({"worker": 3}, r"tasks of job 'worker'.*got int"),
        ({1: ["w:1"]}, r"job names must be strings; got int 1"),
        ({"worker": ["w0:1", 2222]}, r"Task 1 of job 'worker' has address 2222 \(int\)"),
        ({"worker": {0: None}}, r"Task 0 of job 'worker' has address None"),
    ],
)
def test_cluster_spec_rejects_wrong_types(cluster, match):
    with pytest.raises(TypeError, match=match) as info:
        ClusterSpec(cluster)
    assert isinstance(info.value, ClusterConfigError)


@pytest.mark.parametrize("index", [-1, "a", 1.5, True, "-2"])
def test_cluster_spec_rejects_bad_task_indices(index):
    with pytest.raises(ClusterConfigError, match=r"task index .*non-negative integers"):
        ClusterSpec({"worker": {index: "w:1"}})


# -- base: the abstract resolver and the address helpers -----------------------------------------


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


# -- SimpleClusterResolver -----------------------------------------------------------------------


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


# -- TFConfigClusterResolver ---------------------------------------------------------------------


def test_tf_config_chief_worker_ps(monkeypatch):
    set_tf_config(monkeypatch, TF_CONFIG_CHIEF_WORKER_PS)
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec(TF_CONFIG_CHIEF_WORKER_PS["cluster"])
    assert resolver.cluster_spec().jobs == ["chief", "worker", "ps"]
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.rpc_layer is None
    assert resolver.environment is None
    # As TF: the master of a task is its own address, whether or not there is a chief.
    assert resolver.master() == "host2:2222"
    assert resolver.master("chief", 0) == "host0:2222"
    assert resolver.master("ps", 0, rpc_layer="grpc") == "grpc://host3:2222"


def test_tf_config_chief_task(monkeypatch):
    set_tf_config(monkeypatch, {**TF_CONFIG_CHIEF_WORKER_PS, "task": {"type": "chief", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("chief", 0)
    assert resolver.master() == "host0:2222"
    assert resolver.master(task_type="worker") == "host1:2222"  # task_id from TF_CONFIG


def test_tf_config_tensorflow_docstring_example(monkeypatch):
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
            "task": {"type": "worker", "index": 0},
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == {"worker": ["localhost:12345", "localhost:23456"]}
    assert resolver.master() == "localhost:12345"


def test_tf_config_rpc_layer_environment_and_overrides(monkeypatch):
    config = dict(TF_CONFIG_CHIEF_WORKER_PS, rpc_layer="grpc", environment="cloud")
    set_tf_config(monkeypatch, config)
    resolver = TFConfigClusterResolver()
    assert resolver.rpc_layer == "grpc"
    assert resolver.environment == "cloud"
    assert resolver.master() == "grpc://host2:2222"
    assert resolver.master(rpc_layer="") == "host2:2222"

    override = TFConfigClusterResolver(
        task_type="ps", task_id=0, rpc_layer="http", environment="google"
    )
    assert (override.task_type, override.task_id) == ("ps", 0)
    assert (override.rpc_layer, override.environment) == ("http", "google")
    assert override.master() == "http://host3:2222"

    override.task_type, override.task_id, override.rpc_layer = "worker", 0, None
    assert override.master() == "grpc://host1:2222"


def test_tf_config_session_master_wins(monkeypatch):
    set_tf_config(monkeypatch, dict(TF_CONFIG_CHIEF_WORKER_PS, session_master="sm:1"))
    assert TFConfigClusterResolver().master() == "sm:1"
    assert TFConfigClusterResolver().master("ps", 0) == "sm:1"


def test_tf_config_single_task_master_is_empty(monkeypatch):
    set_tf_config(monkeypatch, {"cluster": {"worker": ["w0:1"]}})
    resolver = TFConfigClusterResolver()
    assert resolver.master() == ""
    assert (resolver.task_type, resolver.task_id) == (None, None)


def test_tf_config_multi_task_master_without_task_fails(monkeypatch):
    set_tf_config(monkeypatch, {"cluster": {"worker": ["w0:1", "w1:1"]}})
    resolver = TFConfigClusterResolver()
    with pytest.raises(ClusterConfigError, match=r"master\(\) needs a task.*\"task\""):
        resolver.master()
    assert resolver.master("worker", 1) == "w1:1"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_tf_config_unset_or_blank_is_an_empty_cluster(monkeypatch, value):
    if value is not None:
        monkeypatch.setenv("TF_CONFIG", value)
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert resolver.master() == ""
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.environment is None
    assert TFConfigClusterResolver(task_type="worker", task_id=2).task_id == 2


def test_tf_config_is_read_at_call_time(monkeypatch):
    set_tf_config(
        monkeypatch, {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    )
    resolver = TFConfigClusterResolver()
    set_tf_config(
        monkeypatch,
        {"cluster": {"worker": ["c:1", "d:1", "e:1"]}, "task": {"type": "worker", "index": 2}},
    )
    assert resolver.cluster_spec().num_tasks("worker") == 3
    assert resolver.task_id == 2
    assert resolver.master() == "e:1"
    monkeypatch.setenv("TF_CONFIG", "not json")
    with pytest.raises(ClusterConfigError, match="TF_CONFIG is not valid JSON"):
        resolver.cluster_spec()


def test_tf_config_string_index_and_sparse_cluster(monkeypatch):
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"worker": {"1": "w1:1", "3": "w3:1"}, "ps": ["p:1"]},
            "task": {"type": "worker", "index": "3"},
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.task_id == 3
    assert resolver.cluster_spec().job_tasks("worker") == [None, "w1:1", None, "w3:1"]
    assert resolver.master() == "w3:1"


def test_tf_config_evaluator_may_stand_outside_the_cluster(monkeypatch):
    set_tf_config(
        monkeypatch, {**TF_CONFIG_CHIEF_WORKER_PS, "task": {"type": "evaluator", "index": 0}}
    )
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)


def test_tf_config_num_accelerators(monkeypatch):
    set_tf_config(monkeypatch, TF_CONFIG_CHIEF_WORKER_PS)
    fake_gpu_count(monkeypatch, 2)
    assert TFConfigClusterResolver().num_accelerators() == {"GPU": 2}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (
            "{bad json",
            r"TF_CONFIG is not valid JSON \(.*line 1 column 2\): '\{bad json'.*"
            r"\{\"cluster\": \{\"worker\": \[\"host0:2222\"",
        ),
        ("[1, 2]", r"TF_CONFIG must be a JSON object; got list '\[1, 2\]'"),
        ('"worker"', r"TF_CONFIG must be a JSON object; got str"),
        (
            '{"task": {"type": "worker", "index": 0}}',
            r"TF_CONFIG has no 'cluster' key \(its keys: "
            r"\['task'\]\).*unset TF_CONFIG",
        ),
        ('{"cluster": ["a:1"]}', r"TF_CONFIG 'cluster' must map job names.*\['a:1'\]"),
        ('{"cluster": {"worker": "a:1"}}', r"TF_CONFIG 'cluster': The tasks of job 'worker'"),
        (
            '{"cluster": {"worker": {"x": "a:1"}}}',
            r"TF_CONFIG 'cluster': Job 'worker' has task "
            r"index 'x'",
        ),
        (
            '{"cluster": {"worker": ["a:99999"]}}',
            r"TF_CONFIG cluster 'worker'\[0\].*port "
            r"'99999', outside the valid range 1\.\.65535",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:http"]}}',
            r"cluster 'worker'\[1\].*port 'http', "
            r"which is not an integer",
        ),
        ('{"cluster": {"worker": ["a:0"]}}', r"port '0', outside"),
        (
            '{"cluster": {"worker": ["localhost"]}}',
            r"TF_CONFIG cluster 'worker'\[0\] has address "
            r"'localhost', which is not 'host:port'",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": "worker"}',
            r"TF_CONFIG 'task' must be an "
            r"object.*got 'worker'",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": 0, "index": 0}}',
            r"TF_CONFIG task.type is 0; it must be a job name string",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}',
            r"TF_CONFIG task.index is -1; a task index is a non-negative integer",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "one"}}',
            r"TF_CONFIG task.index is 'one'",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1.0}}',
            r"TF_CONFIG task.index is 1.0",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}',
            r"TF_CONFIG task.type is 'worker' but no task index is set.*\"index\": 0",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
            r"TF_CONFIG task.index is 2, past the end of job 'worker', which has 2 task\(s\) "
            r"\(indices \[0, 1\]\)",
        ),
        (
            '{"cluster": {"worker": {"0": "a:1", "5": "b:1"}}, "task": {"type": "worker", '
            '"index": 3}}',
            r"task.index is 3, past the end of job 'worker', which has 2 task\(s\) "
            r"\(indices \[0, 5\]\)",
        ),
        (
            '{"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, '
            '"task": {"type": "chief", "index": 0}}',
            r"TF_CONFIG task.type is 'chief', which is not a job of TF_CONFIG's cluster; its jobs "
            r"are \['worker', 'ps'\]",
        ),
        ('{"cluster": {"worker": ["a:1"]}, "rpc_layer": 5}', r"TF_CONFIG 'rpc_layer' is 5 \(int\)"),
        ('{"cluster": {"worker": ["a:1"]}, "environment": []}', r"TF_CONFIG 'environment' is \[\]"),
        ('{"cluster": {"worker": ["a:1"]}, "session_master": 1}', r"'session_master' is 1"),
    ],
)
def test_tf_config_malformed_is_rejected_at_construction(monkeypatch, raw, match):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(ValueError, match=match) as info:
        TFConfigClusterResolver()
    assert isinstance(info.value, ClusterConfigError)


def test_tf_config_long_bad_json_is_shortened(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{" + "x" * 1000)
    with pytest.raises(ClusterConfigError, match="…") as info:
        TFConfigClusterResolver()
    assert len(str(info.value)) < 600


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"task_type": "chief", "task_id": 0},
            r"the task_type argument is 'chief', which is not "
            r"a job.*\['worker'\]",
        ),
        ({"task_id": 5}, r"the task_id argument is 5, past the end of job 'worker', which has 2"),
        ({"task_id": -1}, r"the task_id argument is -1; a task index is a non-negative"),
        ({"task_type": 3}, r"task_type is 3 \(int\); it must be a job name string"),
    ],
)
def test_tf_config_bad_overrides_are_rejected(monkeypatch, kwargs, match):
    set_tf_config(
        monkeypatch, {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    )
    with pytest.raises(ClusterConfigError, match=match):
        TFConfigClusterResolver(**kwargs)


def test_tf_config_bad_task_id_override_without_tf_config():
    with pytest.raises(ClusterConfigError, match=r"the task_id argument is 'x'"):
        TFConfigClusterResolver(task_id="x")  # type: ignore[arg-type]


def test_tf_config_explicit_environ_mapping():
    env = {"TF_CONFIG": json.dumps(TF_CONFIG_CHIEF_WORKER_PS)}
    assert TFConfigClusterResolver(environ=env).master() == "host2:2222"


# -- UnionResolver -------------------------------------------------------------------------------


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


# -- Slurm: the parsers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1,3]", ["n1", "n3"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("n[01-03]", ["n01", "n02", "n03"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
        ("n[0001-0003],m5,o[009-011]", ["n0001", "n0002", "n0003", "m5", "o009", "o010", "o011"]),
        ("gpu-node[1-2]-ib", ["gpu-node1-ib", "gpu-node2-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("t02n13,t02n41,t02n43", ["t02n13", "t02n41", "t02n43"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "problem"),
    [
        ("", "it is empty"),
        ("n[1-3", r"a '\[' is never closed"),
        ("n1]", r"a '\]' without '\['"),
        ("n[[1]]", r"a '\[' inside brackets"),
        ("n[3-1]", r"range '3-1' runs backwards"),
        ("n[a-b]", r"range 'a-b' is not 'N' or 'LO-HI'"),
        ("n[]", r"range '' is not"),
        ("n[1-2-3]", r"range '1-2-3' is not"),
        ("a,,b", r"empty or blank name ''"),
        ("a, b", r"empty or blank name ' b'"),
    ],
)
def test_expand_hostlist_rejects(hostlist, problem):
    with pytest.raises(ClusterConfigError, match=rf"SLURM_STEP_NODELIST is .*{problem}"):
        expand_hostlist(hostlist, variable="SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("2", [2]),
        ("2,1,3", [2, 1, 3]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("3(x2),2,1", [3, 3, 2, 1]),
        ("3(x2),2,11(x4)", [3, 3, 2, 11, 11, 11, 11]),
        ("13(x10)", [13] * 10),
    ],
)
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x0)", "-1", "2x3", "2(3)", "1,,2", "1.5"])
def test_expand_tasks_per_node_rejects(text):
    with pytest.raises(ClusterConfigError, match=r"SLURM_TASKS_PER_NODE is .*'N\(xM\)'"):
        expand_tasks_per_node(text, variable="SLURM_TASKS_PER_NODE")


# -- SlurmClusterResolver (TensorFlow's test scenarios first) ------------------------------------


def test_slurm_simple_retrieval_from_env(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_STEP_NUM_TASKS="3",
        SLURM_STEP_TASKS_PER_NODE="1(x3)",
        SLURM_STEP_NODELIST="t02n13,t02n41,t02n43",
        CUDA_VISIBLE_DEVICES="0",
    )
    resolver = SlurmClusterResolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["t02n13:8888", "t02n41:8888", "t02n43:8888"]
    }
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://t02n13:8888"
    assert resolver.num_accelerators() == {"GPU": 1}
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def _three_nodes(monkeypatch, procid: str = "0") -> None:
    set_slurm(
        monkeypatch,
        SLURM_PROCID=procid,
        SLURM_STEP_NUM_TASKS="3",
        SLURM_STEP_NODELIST="t02n13,t02n41,t02n43",
    )


def test_slurm_jobs_and_tasks_per_node(monkeypatch):
    _three_nodes(monkeypatch)
    resolver = SlurmClusterResolver(
        jobs={"worker": 2, "ps": 1},
        port_base=8888,
        tasks_per_node=1,
        gpus_per_node=1,
        gpus_per_task=1,
        auto_set_gpu=False,
    )
    spec = resolver.cluster_spec()
    assert spec.as_dict() == {"ps": ["t02n13:8888"], "worker": ["t02n41:8888", "t02n43:8888"]}
    assert spec.jobs == ["ps", "worker"]  # ranks dealt to jobs in sorted name order
    assert resolver.get_task_info() == ("ps", 0)


def test_slurm_master_retrieval(monkeypatch):
    _three_nodes(monkeypatch)
    resolver = SlurmClusterResolver(
        jobs={"ps": 1, "worker": 2},
        tasks_per_node=1,
        gpus_per_node=1,
        gpus_per_task=1,
        auto_set_gpu=False,
    )
    assert resolver.master() == "grpc://t02n13:8888"  # its own task: ps 0
    resolver.task_type = "worker"
    resolver.task_id = 1
    assert resolver.master() == "grpc://t02n43:8888"
    resolver.cluster_spec()
    assert resolver.get_task_info() == ("worker", 1)  # an assigned task is kept
    resolver.rpc_layer = "ab"
    assert resolver.master("ps", 0) == "ab://t02n13:8888"
    assert resolver.master("ps", 0, rpc_layer="test") == "test://t02n13:8888"
    resolver.task_type = None
    assert resolver.master() == ""


def test_slurm_tasks_per_node_from_env(monkeypatch):
    _three_nodes(monkeypatch, procid="2")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x3)")
    resolver = SlurmClusterResolver(
        jobs={"ps": 1, "worker": 2}, gpus_per_node=1, gpus_per_task=1, auto_set_gpu=False
    )
    assert resolver.cluster_spec().as_dict() == {
        "ps": ["t02n13:8888"],
        "worker": ["t02n41:8888", "t02n43:8888"],
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


@pytest.mark.parametrize(
    ("gpus_per_node", "gpus_per_task", "visible"), [(2, 1, "1"), (4, 2, "2,3"), (4, None, "2,3")]
)
def test_slurm_multi_task_per_node_sets_gpus(monkeypatch, gpus_per_node, gpus_per_task, visible):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="1",
        SLURM_STEP_NUM_TASKS="5",
        SLURM_STEP_TASKS_PER_NODE="2(x2),1",
        SLURM_STEP_NODELIST="t02n13,t02n41,t02n43",
        CUDA_VISIBLE_DEVICES="",
    )
    resolver = SlurmClusterResolver(
        jobs={"ps": 1, "worker": 4},
        port_base=8888,
        gpus_per_node=gpus_per_node,
        gpus_per_task=gpus_per_task,
        auto_set_gpu=True,
    )
    assert resolver.cluster_spec().as_dict() == {
        "ps": ["t02n13:8888"],
        "worker": ["t02n13:8889", "t02n41:8888", "t02n41:8889", "t02n43:8888"],
    }
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)


def test_slurm_compressed_nodelist_and_job_level_fallback(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_JOB_NODELIST="n[01-02]",
        SLURM_TASKS_PER_NODE="2(x2)",
    )
    resolver = SlurmClusterResolver(gpus_per_node=0, port_base=9000)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["n01:9000", "n01:9001", "n02:9000", "n02:9001"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert resolver.master() == "grpc://n02:9001"
    assert resolver.num_accelerators() == {"GPU": 0}
    assert resolver.environment == ""


def test_slurm_step_variables_win_over_job_variables(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_NTASKS="8",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_JOB_NODELIST="a[1-4]",
        SLURM_STEP_NODELIST="a[1-2]",
        SLURM_TASKS_PER_NODE="2(x4)",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
    )
    spec = SlurmClusterResolver(gpus_per_node=0).cluster_spec()
    assert spec.as_dict() == {"worker": ["a1:8888", "a2:8888"]}


def test_slurm_keeps_node_list_order(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_STEP_NUM_TASKS="3",
        SLURM_STEP_NODELIST="n[9-11]",
        SLURM_STEP_TASKS_PER_NODE="1(x3)",
    )
    spec = SlurmClusterResolver(gpus_per_node=0).cluster_spec()
    assert spec.job_tasks("worker") == ["n9:8888", "n10:8888", "n11:8888"]


def test_slurm_tasks_per_node_dict_needs_no_node_list(monkeypatch):
    set_slurm(monkeypatch, SLURM_PROCID="2")
    resolver = SlurmClusterResolver(
        jobs={"worker": 3}, tasks_per_node={"b": 2, "a": 1}, gpus_per_node=0
    )
    assert resolver.cluster_spec().as_dict() == {"worker": ["b:8888", "b:8889", "a:8888"]}
    assert resolver.task_id == 2


def test_slurm_gpus_from_cuda_visible_devices_and_torch(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="1",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="a",
        SLURM_STEP_TASKS_PER_NODE="2",
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    resolver = SlurmClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 2}
    resolver.cluster_spec()
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # as TF: indices, not the listed ids

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "NoDevFiles")
    assert SlurmClusterResolver().num_accelerators() == {"GPU": 0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert SlurmClusterResolver().num_accelerators() == {"GPU": 0}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fake_gpu_count(monkeypatch, 6)
    assert SlurmClusterResolver().num_accelerators() == {"GPU": 3}


def test_slurm_without_gpus_leaves_cuda_visible_devices_alone(monkeypatch):
    set_slurm(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="a",
        SLURM_STEP_TASKS_PER_NODE="2",
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU for two tasks: none each
    resolver = SlurmClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 0}
    resolver.cluster_spec()
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_slurm_explicit_environ_is_written_with_auto_set_gpu():
    env = {
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "a",
        "SLURM_STEP_TASKS_PER_NODE": "2",
    }
    SlurmClusterResolver(gpus_per_node=2, environ=env).cluster_spec()
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


# A job-level (batch) environment of 4 tasks on 2 nodes; each case below changes it.
TWO_NODES = {
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "a,b",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
NO_NODES = {"SLURM_JOB_NODELIST": None, "SLURM_TASKS_PER_NODE": None}
R, V = RuntimeError, ValueError

SLURM_REJECTS = [
    # (changes to TWO_NODES (None removes), constructor kwargs, builtin, message)
    ({"SLURM_PROCID": None}, {}, R, r"SLURM_PROCID is not set: not running inside a Slurm"),
    ({"SLURM_NTASKS": None}, {}, R, r"SLURM_STEP_NUM_TASKS and SLURM_NTASKS are not set"),
    ({"SLURM_JOB_NODELIST": None}, {}, R, r"SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not"),
    ({"SLURM_TASKS_PER_NODE": None}, {}, R, r"SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_N"),
    ({"SLURM_PROCID": "zero"}, {}, V, r"SLURM_PROCID is 'zero'; it must be an integer >= 0"),
    ({"SLURM_STEP_NUM_TASKS": "0"}, {}, V, r"SLURM_STEP_NUM_TASKS is '0'; it must be an integ"),
    ({"SLURM_JOB_NODELIST": "a[1-"}, {}, V, r"SLURM_JOB_NODELIST is 'a\[1-'.*never closed"),
    ({"SLURM_TASKS_PER_NODE": "1(x"}, {}, V, r"SLURM_TASKS_PER_NODE is '1\(x'; entry '1\(x' is"),
    (
        {"SLURM_TASKS_PER_NODE": "1(x3)"},
        {},
        V,
        r"SLURM_JOB_NODELIST='a,b' names 2 node\(s\) but SLURM_TASKS_PER_NODE='1\(x3\)' gives",
    ),
    ({"SLURM_JOB_NODELIST": "a,a"}, {}, V, r"names node\(s\) \['a'\] more than once"),
    (
        {},
        {"gpus_per_node": 2, "gpus_per_task": 2},
        R,
        r"Requested more GPUs per node than available: 2 task\(s\) on a node × "
        r"gpus_per_task=2 needs 4 GPUs, but gpus_per_node is 2",
    ),
    ({}, {"jobs": {"worker": 3}}, R, r"jobs \{'worker': 3\} ask for 3 task\(s\) but the Slurm"),
    ({"SLURM_PROCID": "4"}, {}, V, r"SLURM_PROCID is 4 but the step has only 4 task\(s\)"),
    ({}, {"port_base": 65535}, V, r"port_base=65535 with 2 task\(s\) on a node.*<= 65534"),
    ({}, {"port_base": "http"}, V, r"port_base is 'http'; it must be an integer >= 1"),
    ({}, {"jobs": ["worker"]}, V, r"jobs is \['worker'\]; it must be a non-empty dict"),
    ({}, {"jobs": {"worker": -1}}, V, r"jobs\['worker'\] is -1; it must be an integer >= 0"),
    ({}, {"jobs": {"": 4}}, V, r"jobs has the job name ''"),
    ({}, {"tasks_per_node": 0}, V, r"tasks_per_node is 0; it must be an integer >= 1"),
    (NO_NODES, {"jobs": {"w": 1}, "tasks_per_node": {"a": 0}}, V, r"no task on any node"),
    (NO_NODES, {"tasks_per_node": {"a": "x"}}, V, r"tasks_per_node\['a'\] is 'x'"),
    ({}, {"gpus_per_node": -1}, V, r"gpus_per_node is -1; it must be an integer >= 0"),
    ({}, {"gpus_per_task": "x"}, V, r"gpus_per_task is 'x'; it must be an integer >= 0"),
]


@pytest.mark.parametrize(("changes", "kwargs", "error", "match"), SLURM_REJECTS)
def test_slurm_rejects(monkeypatch, changes, kwargs, error, match):
    env = {**TWO_NODES, **changes}
    set_slurm(monkeypatch, **{name: value for name, value in env.items() if value is not None})
    with pytest.raises(error, match=match) as info:
        SlurmClusterResolver(**{"gpus_per_node": 0, **kwargs})
    assert isinstance(info.value, ClusterConfigError)


# -- TorchrunClusterResolver ---------------------------------------------------------------------

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_torchrun_resolver(monkeypatch):
    set_slurm(monkeypatch, **TORCHRUN)
    resolver = TorchrunClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert (resolver.world_size, resolver.local_rank, resolver.local_world_size) == (4, 1, 2)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["10.0.0.1:29500", "10.0.0.1:29501", "10.0.0.1:29502", "10.0.0.1:29503"]
    }
    assert resolver.cluster_spec().num_tasks("worker") == 4
    assert resolver.master() == "10.0.0.1:29500"
    assert resolver.master(rpc_layer="tcp") == "tcp://10.0.0.1:29500"
    assert resolver.master("worker", 2) == "10.0.0.1:29502"
    assert resolver.rpc_layer is None
    assert resolver.environment == ""
    fake_gpu_count(monkeypatch, 2)
    assert resolver.num_accelerators() == {"GPU": 2}


def test_torchrun_without_local_variables():
    env = {k: v for k, v in TORCHRUN.items() if not k.startswith("LOCAL")}
    resolver = TorchrunClusterResolver(environ=env)
    assert (resolver.local_rank, resolver.local_world_size) == (None, None)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"RANK": "4"}, r"RANK is 4 but WORLD_SIZE is 4, so ranks run 0..3"),
        ({"RANK": "one"}, r"RANK is 'one'; it must be an integer >= 0"),
        ({"RANK": "-1"}, r"RANK is '-1'; it must be an integer >= 0"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE is '0'; it must be an integer >= 1"),
        ({"WORLD_SIZE": "4.0"}, r"WORLD_SIZE is '4.0'"),
        ({"RANK": None}, r"RANK is not set, so this is not a torchrun launch"),
        ({"WORLD_SIZE": None}, r"WORLD_SIZE is not set"),
        ({"LOCAL_RANK": "x"}, r"LOCAL_RANK is 'x'; it must be an integer >= 0"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK is 2 but LOCAL_WORLD_SIZE is 2"),
        ({"LOCAL_WORLD_SIZE": "0"}, r"LOCAL_WORLD_SIZE is '0'; it must be an integer >= 1"),
        ({"LOCAL_WORLD_SIZE": "8"}, r"LOCAL_WORLD_SIZE is 8, more than WORLD_SIZE 4"),
        ({"MASTER_ADDR": None}, r"MASTER_ADDR is None: with RANK and WORLD_SIZE set"),
        ({"MASTER_ADDR": " "}, r"MASTER_ADDR is ' '"),
        ({"MASTER_PORT": None}, r"MASTER_PORT is not set"),
        ({"MASTER_PORT": "http"}, r"MASTER_PORT has port 'http', which is not an integer"),
        ({"MASTER_PORT": "0"}, r"MASTER_PORT has port '0', outside the valid range"),
        ({"MASTER_PORT": "65536"}, r"MASTER_PORT has port '65536', outside"),
        ({"MASTER_PORT": "65534"}, r"MASTER_PORT is 65534; with WORLD_SIZE 4 .* up to 65537"),
    ],
)
def test_torchrun_rejects(monkeypatch, changes, match):
    env = dict(TORCHRUN)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    set_slurm(monkeypatch, **env)
    with pytest.raises(ClusterConfigError, match=match):
        TorchrunClusterResolver()


# -- resolve_cluster -----------------------------------------------------------------------------

SLURM_STEP = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
}


def test_resolve_cluster_nothing_set():
    assert resolve_cluster() is None
    assert resolve_cluster({}) is None


def test_resolve_cluster_order_tf_config_then_torchrun_then_slurm(monkeypatch):
    set_slurm(monkeypatch, **SLURM_STEP)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    slurm = resolve_cluster()
    assert isinstance(slurm, SlurmClusterResolver)
    assert slurm.get_task_info() == ("worker", 1)
    slurm.cluster_spec()
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # auto_set_gpu=False

    set_slurm(monkeypatch, **TORCHRUN)
    assert isinstance(resolve_cluster(), TorchrunClusterResolver)

    set_tf_config(monkeypatch, TF_CONFIG_CHIEF_WORKER_PS)
    resolver = resolve_cluster()
    assert isinstance(resolver, TFConfigClusterResolver)
    assert resolver.master() == "host2:2222"


def test_resolve_cluster_blank_tf_config_falls_through():
    env = {"TF_CONFIG": " ", **TORCHRUN}
    assert isinstance(resolve_cluster(env), TorchrunClusterResolver)


def test_resolve_cluster_half_a_torchrun_environment_is_not_one():
    assert resolve_cluster({"RANK": "0"}) is None
    assert resolve_cluster({"WORLD_SIZE": "2"}) is None


@pytest.mark.parametrize(
    "env",
    [
        # a batch script: job-level variables only, no step
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-4]"},
        # a one-task step (e.g. `srun --pty jupyter lab`)
        {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"},
        # an allocation without a task rank
        {k: v for k, v in SLURM_STEP.items() if k != "SLURM_PROCID"},
    ],
)
def test_resolve_cluster_slurm_needs_a_multi_task_step(env):
    assert resolve_cluster(env) is None


def test_resolve_cluster_malformed_sources_raise():
    with pytest.raises(ClusterConfigError, match="TF_CONFIG is not valid JSON"):
        resolve_cluster({"TF_CONFIG": "{", **TORCHRUN})
    with pytest.raises(ClusterConfigError, match="RANK is 9 but WORLD_SIZE is 4"):
        resolve_cluster({**TORCHRUN, "RANK": "9"})
    with pytest.raises(ClusterConfigError, match="SLURM_STEP_NODELIST is 'node\\[1-'"):
        resolve_cluster({**SLURM_STEP, "SLURM_STEP_NODELIST": "node[1-"})
