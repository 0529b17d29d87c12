"""ClusterSpec: dense and sparse jobs, copies, equality, lookups and every malformed cluster."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import ClusterSpec
from nbdist.errors import ClusterConfigError


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
