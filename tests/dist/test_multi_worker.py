"""MultiWorkerMirroredStrategy across 2 real worker processes (gloo on CPU).

One launch per way of describing the cluster (torchrun variables, TF_CONFIG) runs every
collective, reduction, variable kind and input check below and reports what each worker saw;
the tests compare those reports with exact values. Worker `r` is replica `r`.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.utils.data as tud

from nbdist.testing import (
    assert_all_ok,
    free_port,
    free_ports,
    run_workers,
    tf_config_env,
    torchrun_env,
)
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 60

WORKER = worker_source("multi_worker")


def _launch(mode: str) -> list:
    if mode == "torchrun":
        port = free_port()
        envs = [torchrun_env(rank, 2, port) for rank in range(2)]
    else:
        ports = free_ports(2)
        envs = [tf_config_env(rank, 2, ports) for rank in range(2)]
    return run_workers(WORKER, envs, timeout=LAUNCH_TIMEOUT, fail_fast=True)


@pytest.fixture(scope="session", params=["torchrun", "tf_config"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def reports(mode, launch_once) -> list[dict]:
    results = launch_once(f"multi-worker-{mode}", lambda: _launch(mode))
    assert_all_ok(results)
    assert [result.reported for result in results] == [True, True]
    return [result.result for result in results]


def test_topology_and_replica_ids(reports, mode):
    resolver = "TorchrunClusterResolver" if mode == "torchrun" else "TFConfigClusterResolver"
    for rank, out in enumerate(reports):
        assert out["topology"] == {
            "num_replicas_in_sync": 2,
            "resolver": resolver,
            "task_type": "worker",
            "task_id": rank,
            "backend": "gloo",
            "worker_devices": ["cpu:0"],
            "experimental_alias": True,
        }
        assert out["replica"] == {"id": rank, "num": 2, "strategy": True, "cross_replica": False}


def test_all_reduce_sum_mean_max_min_and_nested(reports):
    # worker 0 holds [1, 10, 0], worker 1 holds [2, 5, 1]
    for out in reports:
        c = out["collectives"]
        assert c["sum"] == [3.0, 15.0, 1.0]
        assert c["mean"] == [1.5, 7.5, 0.5]
        assert c["max"] == [2.0, 10.0, 1.0]
        assert c["min"] == [1.0, 5.0, 0.0]
        assert c["nested"] == {
            "keys": ["a", "b"],
            "a": [1, 4],
            "a_dtype": "torch.int64",
            "b_type": "tuple",
            "b0": 4.5,
            "b1": [[3.0, 3.0], [3.0, 3.0]],
        }
        assert c["many"] == [[3.0, 15.0, 1.0], [6.0, 30.0, 2.0], [1, 2]]


def test_all_gather_different_lengths_in_rank_order(reports):
    for out in reports:
        c = out["collectives"]
        assert c["gather_axis0"] == [0, 1, 10, 11, 12]
        assert c["gather_axis1"] == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
        assert c["gather_axis_neg"] == [[1.0, 2.0, 2.0]]
        assert c["gather_nested"] == {"u": [0.0, 1.0], "v": [[0, 0], [1, 1]]}


def test_merge_call_runs_once_per_worker_in_cross_replica_context(reports):
    for rank, out in enumerate(reports):
        assert out["merge"]["calls"] == [
            {
                "cross_replica": True,
                "replica_context_is_none": True,
                "strategy": True,
                "value": [rank + 1.0, 10.0 * rank],
                "tag": "t",
            }
        ]
        # merge_fn's strategy.reduce combined both workers; every replica got the result back
        assert out["merge"]["result"] == {"merged": [3.0, 10.0], "back_in_replica": True}


def test_reduce_axis_none_and_axis_0_with_different_batch_sizes(reports):
    expected = {
        # same shape everywhere: [1, 10, 0] | [2, 5, 1]
        # batch: [0, 1, 2, 3] | [4, 5]  (MEAN over 6 elements, not a mean of 2 means)
        # rows: 4 rows | 2 rows of 2 columns, arange(12) in order
        # empty: [7, 8] | []  (the empty worker contributes nothing)
        "SUM": {"same": [3.0, 15.0, 1.0], "batch": 15.0, "rows": [30.0, 36.0], "empty": 15.0},
        "MEAN": {"same": [1.5, 7.5, 0.5], "batch": 2.5, "rows": [5.0, 6.0], "empty": 7.5},
        "MAX": {"same": [2.0, 10.0, 1.0], "batch": 5.0, "rows": [10.0, 11.0], "empty": 8.0},
        "MIN": {"same": [1.0, 5.0, 0.0], "batch": 0.0, "rows": [0.0, 1.0], "empty": 7.0},
    }
    for rank, out in enumerate(reports):
        r = out["reduce"]
        for op, values in expected.items():
            assert r[op] == values, op
        assert r["ints"] == {
            "mean": [0.5, 3.0],  # [0, 3] | [1, 3]: integer MEAN is floating
            "mean_dtype": "torch.float32",
            "mean_axis0": 1.75,
            "sum_axis0": 7,
            "sum_axis0_dtype": "torch.int64",
        }
        assert r["nested"] == {
            "s": [3.0, 15.0, 1.0],
            "t0": [3.0, 15.0, 1.0],
            "t1": [6.0, 30.0, 2.0],
        }
        assert r["local_results"] == [[1.0 + rank, 10.0 - 5.0 * rank, float(rank)]]


def test_gather_concatenates_workers_in_rank_order(reports):
    for out in reports:
        assert out["gather"] == {
            "batch": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            "rows": torch.arange(12.0).reshape(6, 2).tolist(),
            "columns": torch.arange(12.0).reshape(6, 2).T.tolist(),
            "empty": [7.0, 8.0],
            "ints": [0, 3, 1, 3],
        }


def test_reduce_to_and_batch_reduce_to_across_workers(reports):
    for out in reports:
        assert out["reduce_to"] == {
            "sum": [3.0, 15.0, 1.0],
            "mean": [1.5, 7.5, 0.5],
            "max": [2.0, 10.0, 1.0],
            "batch_sum": [[3.0, 15.0, 1.0], [10.0]],
            "batch_mean": [[1.5, 7.5, 0.5], [5.0]],
            "batch_min": [[1.0, 5.0, 0.0], [0.0]],
        }


def test_mirrored_variables_broadcast_and_aggregate_across_workers(reports):
    for out in reports:
        v = out["variables"]
        assert v["mirrored_type"] == "MirroredVariable"
        assert v["mirrored_sync"] == "ON_WRITE"
        # rank-dependent initial values: every worker ends with worker 0's
        assert v["initial"] == [1.0, 0.0]
        assert v["from_fn"] == [3.0, 3.0]
        assert "aggregation" in v["update"]["none_error"]
        after = v["after_add"]
        assert after["sum"] == [3.0, 10.0]  # 0 + ([1, 0] + [2, 10])
        assert after["mean"] == [2.5, 6.0]  # 1 + mean([1, 0], [2, 10])
        assert after["first"] == 5.0  # worker 0's value
        second = v["after_second"]
        assert second["sum"] == [1.0, 9.0]  # [3, 10] - ([1, 0] + [1, 1])
        assert second["mean"] == [2.0, 2.0]  # mean([0, 2], [4, 2])
        assert second["mirrored"] == [3.0, 4.0]
        assert second["mirrored_in_replica"] == [3.0, 4.0]


def test_sync_on_read_variables_aggregate_across_workers_when_read(reports):
    for rank, out in enumerate(reports):
        v = out["variables"]
        assert v["sync_on_read_type"] == "SyncOnReadVariable"
        assert v["sync_on_read_trainable"] is False
        assert v["update"]["sor_local"] == rank + 1.0  # in replica context: the local component
        assert v["after_add"]["sor_sum"] == 3.0  # 1 + 2
        assert v["after_add"]["sor_mean"] == 1.5
        assert v["after_add"]["sor_first"] == 1.0  # worker 0's
        assert v["after_second"]["sor_mean"] == 4.0  # cross-replica assign of a MEAN variable
        assert v["after_second"]["sor_mean_in_replica"] == 4.0
        assert "SUM" in v["after_second"]["sor_sum_add_error"]


def test_cross_replica_assign_of_sum_sync_on_read_splits_over_all_replicas(reports):
    # API.md §5: SUM writes value / N to each of the N components; the read gives value back.
    for out in reports:
        assert out["sor_sum_assign"] == {"read": 10.0, "components": 5.0}


def test_map_style_loader_is_sharded_by_index(reports):
    loader = tud.DataLoader(
        tud.TensorDataset(torch.arange(10)),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(7),
    )
    epochs = [[batch[0].tolist() for batch in loader] for _ in range(2)]
    assert epochs[0] != epochs[1]  # reshuffled, so the workers must follow the same generator
    halves = [
        [[batch[: (len(batch) + 1) // 2] for batch in epoch] for epoch in epochs],  # worker 0
        [[batch[(len(batch) + 1) // 2 :] for batch in epoch] for epoch in epochs],  # worker 1
    ]
    for rank, out in enumerate(reports):
        assert out["dataset"] == {"len": 3, "epochs": halves[rank]}
    for epoch in range(2):
        seen = [x for out in reports for batch in out["dataset"]["epochs"][epoch] for x in batch]
        assert sorted(seen) == list(range(10))  # every element exactly once per epoch


def test_telemetry_records_the_collectives(reports):
    for rank, out in enumerate(reports):
        t = out["telemetry"]
        assert {
            "all_reduce:SUM",
            "all_reduce:MEAN",
            "all_reduce:MAX",
            "all_reduce:MIN",
            "all_gather:0",
            "all_gather:1",
            "broadcast",
        } <= set(t["ops"])
        assert t["implementations"] == ["gloo"]
        assert t["replicas"] == [[rank]]
        assert t["bytes_positive"] and t["durations_nonnegative"]


def test_chief_and_worker_tasks_rank_chief_first():
    """TF_CONFIG with a chief: the chief is rank 0 (hosts the rendezvous), then the workers."""
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    tasks = [{"type": "worker", "index": 0}, {"type": "chief", "index": 0}]  # worker first
    envs = [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})} for task in tasks]
    code = """
        import torch
        torch.set_num_threads(1)
        import nbdist as nd

        strategy = nd.MultiWorkerMirroredStrategy()
        ctx_id = strategy.run(lambda: nd.get_replica_context().replica_id_in_sync_group)
        gathered = strategy.run(
            lambda: nd.get_replica_context().all_gather(torch.tensor([ctx_id]), axis=0))
        report({"type": strategy.cluster_resolver.task_type, "replica": ctx_id,
                "num": strategy.num_replicas_in_sync, "gathered": gathered})
        strategy.shutdown()
    """
    results = run_workers(code, envs, timeout=LAUNCH_TIMEOUT, fail_fast=True)
    assert_all_ok(results)
    assert [r.result for r in results] == [
        {"type": "worker", "replica": 1, "num": 2, "gathered": [0, 1]},
        {"type": "chief", "replica": 0, "num": 2, "gathered": [0, 1]},
    ]
