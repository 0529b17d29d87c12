"""SlurmClusterResolver and its parsers (hostlists, tasks per node): TensorFlow's scenarios first,
then every bad environment.
"""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import SlurmClusterResolver
from nbdist.cluster_resolver.slurm import expand_hostlist, expand_tasks_per_node
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import fake_gpu_count, set_slurm


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
