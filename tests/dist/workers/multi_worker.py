"""Worker script of tests/dist/test_multi_worker.py (`WORKER`)."""

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    import torch.utils.data as tud

    strategy, rank = start()
    resolver = strategy.cluster_resolver
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


    # --- replica-context collectives ---
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

    # --- merge_call ---
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


    # --- reduce, gather, reduce_to, batch_reduce_to ---
    def values():
        r = nd.get_replica_context().replica_id_in_sync_group
        return {
            "same": torch.tensor([1.0 + r, 10.0 - 5.0 * r, float(r)]),
            "batch": torch.arange(4.0) if r == 0 else torch.tensor([4.0, 5.0]),
            "rows": (
                torch.arange(8.0).reshape(4, 2) if r == 0 else torch.arange(8.0, 12.0).view(2, 2)
            ),
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
        "batch_min": ext.batch_reduce_to(
            nd.ReduceOp.MIN, [(v["same"], "cpu:0"), (second, "cpu:0")]
        ),
    }

    # --- variables ---
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

    # --- input: a map-style DataLoader is sharded by index ---
    loader = tud.DataLoader(
        tud.TensorDataset(torch.arange(10)), batch_size=4, shuffle=True,
        generator=torch.Generator().manual_seed(7),
    )
    dist_loader = strategy.experimental_distribute_dataset(loader)
    out["dataset"] = {
        "len": len(dist_loader),
        "epochs": [[batch[0].tolist() for batch in dist_loader] for _ in range(2)],
    }

    # --- telemetry ---
    records = strategy.extended.telemetry.records()
    out["telemetry"] = {
        "ops": sorted({record.op for record in records}),
        "implementations": sorted({record.implementation for record in records}),
        "replicas": sorted({tuple(record.replicas) for record in records}),
        "bytes_positive": all(record.nbytes > 0 for record in records),
        "durations_nonnegative": all(record.duration >= 0 for record in records),
    }

    # --- last: a cross-replica assign of a SUM SyncOnRead variable (checkpoint restore) ---
    sor_sum.assign(torch.tensor(10.0))
    out["sor_sum_assign"] = {
        "read": sor_sum.read_value().tolist(),
        "components": strategy.run(lambda: sor_sum.read_value().tolist()),
    }

    strategy.shutdown()
    report(out)
