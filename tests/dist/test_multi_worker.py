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

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 60

WORKER = r"""
import torch
torch.set_num_threads(1)
import torch.utils.data as tud
import nbdist as nd

strategy = nd.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
rank = resolver.task_id
out = {}

# --- topology ---------------------------------------------------------------------------------
out["topology"] = {
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
    "resolver": type(resolver).__name__,
    "task_type": resolver.task_type,
    "task_id": resolver.task_id,
    "backend": strategy.process_group_backend,
    "worker_devices": list(strategy.extended.worker_devices),
    "experimental_alias": nd.experimental.MultiWorkerMirroredStrategy
    is nd.MultiWorkerMirroredStrategy,
}


def replica_info():
    ctx = nd.get_replica_context()
    return {
        "id": ctx.replica_id_in_sync_group,
        "num": ctx.num_replicas_in_sync,
        "strategy": nd.get_strategy() is strategy,
        "cross_replica": nd.in_cross_replica_context(),
    }


out["replica"] = strategy.run(replica_info)


# --- replica-context collectives -----------------------------------------------------------------
def collectives():
    ctx = nd.get_replica_context()
    r = ctx.replica_id_in_sync_group
    x = torch.tensor([1.0 + r, 10.0 - 5.0 * r, float(r)])
    nested = {
        "a": torch.tensor([r, 2 * r + 1]),
        "b": (torch.tensor(1.5 * (r + 1)), torch.full((2, 2), r + 1.0)),
    }
    reduced = ctx.all_reduce("sum", nested)
    many = ctx.all_reduce(nd.ReduceOp.SUM, [x, x * 2, torch.tensor([r, 1])])
    gathered = ctx.all_gather({"u": torch.tensor([float(r)]), "v": torch.tensor([[r, r]])}, 0)
    return {
        "sum": ctx.all_reduce("sum", x),
        "mean": ctx.all_reduce(nd.ReduceOp.MEAN, x),
        "max": ctx.all_reduce("MAX", x),
        "min": ctx.all_reduce(nd.ReduceOp.MIN, x),
        "nested": {
            "keys": sorted(reduced),
            "a": reduced["a"],
            "a_dtype": str(reduced["a"].dtype),
            "b_type": type(reduced["b"]).__name__,
            "b0": reduced["b"][0],
            "b1": reduced["b"][1],
        },
        "many": many,
        "gather_axis0": ctx.all_gather(torch.arange(r + 2) + 10 * r, axis=0),
        "gather_axis1": ctx.all_gather(torch.full((2, r + 1), float(r)), axis=1),
        "gather_axis_neg": ctx.all_gather(torch.full((1, r + 1), r + 1.0), axis=-1),
        "gather_nested": gathered,
    }


out["collectives"] = strategy.run(collectives)

# --- merge_call --------------------------------------------------------------------------------
merge_calls = []


def merge_fn(s, value, tag):
    merge_calls.append({
        "cross_replica": nd.in_cross_replica_context(),
        "replica_context_is_none": nd.get_replica_context() is None,
        "strategy": s is strategy,
        "value": value.tolist(),
        "tag": tag,
    })
    return s.reduce("sum", value, axis=None)


def merging():
    ctx = nd.get_replica_context()
    r = ctx.replica_id_in_sync_group
    value = torch.tensor([r + 1.0, 10.0 * r])
    merged = ctx.merge_call(merge_fn, args=(value,), kwargs={"tag": "t"})
    return {"merged": merged, "back_in_replica": nd.get_replica_context() is not None}


out["merge"] = {"result": strategy.run(merging), "calls": merge_calls}


# --- reduce, gather, reduce_to, batch_reduce_to -------------------------------------------------
def values():
    r = nd.get_replica_context().replica_id_in_sync_group
    return {
        "same": torch.tensor([1.0 + r, 10.0 - 5.0 * r, float(r)]),
        "batch": torch.arange(4.0) if r == 0 else torch.tensor([4.0, 5.0]),
        "rows": torch.arange(8.0).reshape(4, 2) if r == 0 else torch.arange(8.0, 12.0).view(2, 2),
        "ints": torch.tensor([r, 3]),
        "empty": torch.tensor([7.0, 8.0]) if r == 0 else torch.zeros(0),
    }


v = strategy.run(values)
reduced = {}
for op in ["SUM", "MEAN", "MAX", "MIN"]:
    reduced[op] = {
        "same": strategy.reduce(op, v["same"], axis=None),
        "batch": strategy.reduce(op, v["batch"], axis=0),
        "rows": strategy.reduce(op, v["rows"], axis=0),
        "empty": strategy.reduce(op, v["empty"], axis=0),
    }
int_mean = strategy.reduce("mean", v["ints"], axis=None)
int_sum = strategy.reduce(nd.ReduceOp.SUM, v["ints"], axis=0)
reduced["ints"] = {
    "mean": int_mean, "mean_dtype": str(int_mean.dtype),
    "mean_axis0": strategy.reduce("mean", v["ints"], axis=0),
    "sum_axis0": int_sum, "sum_axis0_dtype": str(int_sum.dtype),
}
nested = strategy.reduce("sum", {"s": v["same"], "t": (v["same"], v["same"] * 2)}, axis=None)
reduced["nested"] = {"s": nested["s"], "t0": nested["t"][0], "t1": nested["t"][1]}
reduced["local_results"] = list(strategy.experimental_local_results(v["same"]))
out["reduce"] = reduced

out["gather"] = {
    "batch": strategy.gather(v["batch"], axis=0),
    "rows": strategy.gather(v["rows"], axis=0),
    "columns": strategy.gather(v["rows"].T.contiguous(), axis=1),
    "empty": strategy.gather(v["empty"], axis=0),
    "ints": strategy.gather(v["ints"], axis=0),
}

ext = strategy.extended
second = torch.tensor([10.0 * rank])
out["reduce_to"] = {
    "sum": ext.reduce_to("sum", v["same"], destinations="cpu:0"),
    "mean": ext.reduce_to(nd.ReduceOp.MEAN, v["same"], destinations="cpu:0"),
    "max": ext.reduce_to("max", v["same"], "cpu:0"),
    "batch_sum": ext.batch_reduce_to("sum", [(v["same"], "cpu:0"), (second, "cpu:0")]),
    "batch_mean": ext.batch_reduce_to("mean", [(v["same"], "cpu:0"), (second, "cpu:0")]),
    "batch_min": ext.batch_reduce_to(nd.ReduceOp.MIN, [(v["same"], "cpu:0"), (second, "cpu:0")]),
}

# --- variables ---------------------------------------------------------------------------------
Agg, Sync = nd.VariableAggregation, nd.VariableSynchronization
with strategy.scope():
    mirrored = nd.Variable(torch.tensor([rank + 1.0, 7.0 * rank]), name="w")
    from_fn = nd.Variable(lambda: torch.full((2,), 3.0 + rank))
    v_sum = nd.Variable(torch.zeros(2), aggregation=Agg.SUM)
    v_mean = nd.Variable(torch.ones(2), aggregation=Agg.MEAN)
    v_first = nd.Variable(torch.zeros(()), aggregation=Agg.ONLY_FIRST_REPLICA)
    v_none = nd.Variable(torch.zeros(()))
    sor_sum = nd.Variable(torch.zeros(()), synchronization=Sync.ON_READ, aggregation=Agg.SUM)
    sor_mean = nd.Variable(torch.zeros(()), synchronization=Sync.ON_READ, aggregation=Agg.MEAN)
    sor_first = nd.Variable(
        torch.zeros(()), synchronization=Sync.ON_READ, aggregation=Agg.ONLY_FIRST_REPLICA
    )
variables = {
    "mirrored_type": type(mirrored).__name__,
    "mirrored_sync": mirrored.synchronization.name,
    "sync_on_read_type": type(sor_sum).__name__,
    "sync_on_read_trainable": sor_sum.trainable,
    "initial": mirrored.numpy().tolist(),
    "from_fn": from_fn.numpy().tolist(),
}


def update():
    r = nd.get_replica_context().replica_id_in_sync_group
    v_sum.assign_add(torch.tensor([r + 1.0, 10.0 * r]))
    v_mean.assign_add(torch.tensor([r + 1.0, 10.0 * r]))
    v_first.assign(torch.tensor(r + 5.0))
    for variable in (sor_sum, sor_mean, sor_first):
        variable.assign_add(torch.tensor(r + 1.0))
    try:
        v_none.assign(torch.tensor(1.0))
        none_error = None
    except ValueError as error:
        none_error = str(error)
    return {"sor_local": sor_sum.read_value().tolist(), "none_error": none_error}


variables["update"] = strategy.run(update)
variables["after_add"] = {
    "sum": v_sum.numpy().tolist(),
    "mean": v_mean.numpy().tolist(),
    "first": v_first.numpy().tolist(),
    "sor_sum": sor_sum.read_value(), "sor_mean": sor_mean.read_value(),
    "sor_first": sor_first.read_value(),
}


def update_again():
    r = nd.get_replica_context().replica_id_in_sync_group
    v_sum.assign_sub(torch.tensor([1.0, float(r)]))
    v_mean.assign(torch.tensor([4.0 * r, 2.0]))


strategy.run(update_again)
mirrored.assign(torch.tensor([3.0, 4.0]))
sor_mean.assign(torch.tensor(4.0))
try:
    sor_sum.assign_add(torch.tensor(1.0))
    sor_sum_add_error = None
except ValueError as error:
    sor_sum_add_error = str(error)
variables["after_second"] = {
    "sum": v_sum.numpy().tolist(),
    "mean": v_mean.numpy().tolist(),
    "mirrored": mirrored.numpy().tolist(),
    "mirrored_in_replica": strategy.run(lambda: mirrored * 1),
    "sor_mean": sor_mean.read_value(),
    "sor_mean_in_replica": strategy.run(lambda: sor_mean.read_value().tolist()),
    "sor_sum_add_error": sor_sum_add_error,
}
out["variables"] = variables

# --- input: a map-style DataLoader is sharded by index --------------------------------------------
loader = tud.DataLoader(
    tud.TensorDataset(torch.arange(10)), batch_size=4, shuffle=True,
    generator=torch.Generator().manual_seed(7),
)
dist_loader = strategy.experimental_distribute_dataset(loader)
out["dataset"] = {
    "len": len(dist_loader),
    "epochs": [[batch[0].tolist() for batch in dist_loader] for _ in range(2)],
}

# --- telemetry ---------------------------------------------------------------------------------
records = strategy.extended.telemetry.records()
out["telemetry"] = {
    "ops": sorted({record.op for record in records}),
    "implementations": sorted({record.implementation for record in records}),
    "replicas": sorted({tuple(record.replicas) for record in records}),
    "bytes_positive": all(record.nbytes > 0 for record in records),
    "durations_nonnegative": all(record.duration >= 0 for record in records),
}

# --- last: a cross-replica assign of a SUM SyncOnRead variable (checkpoint restore) --------------
sor_sum.assign(torch.tensor(10.0))
out["sor_sum_assign"] = {
    "read": sor_sum.read_value().tolist(),
    "components": strategy.run(lambda: sor_sum.read_value().tolist()),
}

strategy.shutdown()
report(out)
"""


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
