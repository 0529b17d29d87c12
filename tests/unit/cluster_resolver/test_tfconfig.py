"""TFConfigClusterResolver: TF_CONFIG read at call time, overrides and every malformed TF_CONFIG."""

from __future__ import annotations

import json

import pytest

from nbdist.cluster_resolver import ClusterSpec, TFConfigClusterResolver
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import (
    TF_CONFIG_CHIEF_WORKER_PS,
    fake_gpu_count,
    set_tf_config,
)


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
