"""Worker script of tests/dist/test_checkpoint_workers.py (`ERRORS`)."""

import os
import pathlib
import time

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    import nbdist.checkpoint.save_restore as save_restore

    strategy, rank = start(timeout_seconds=30)
    folder = pathlib.Path(os.environ["FOLDER"])
    writes = []
    real_write = save_restore.write_atomic
    save_restore.write_atomic = lambda *a, **k: (writes.append(a[0]), real_write(*a, **k))


    def attempt(fn, *args, **kwargs):
        started = time.monotonic()
        try:
            fn(*args, **kwargs)
            return {"ok": True, "elapsed": time.monotonic() - started}
        except Exception as error:
            return {"type": type(error).__name__, "message": str(error),
                    "bases": [c.__name__ for c in type(error).__mro__],
                    "elapsed": time.monotonic() - started}


    with strategy.scope():
        model = torch.nn.Linear(64, 64)
        total = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
    strategy.run(lambda: total.assign(float(rank + 1)))
    out = {}
    good = str(folder / "good.pt")
    out["save"] = attempt(nd.checkpoint.save, good, model=model, total=total)
    out["writes"] = len(writes)
    out["saved_total"] = nd.checkpoint.read(good)["total"]["value"].item()
    (folder / "afile").write_text("x")  # a file where a directory should be
    out["unwritable"] = attempt(nd.checkpoint.save, str(folder / "afile" / "c.pt"), model=model)
    out["another_model"] = attempt(nd.checkpoint.restore, good, model=torch.nn.Linear(64, 3))
    truncated = folder / "truncated.pt"
    if rank == 0:
        data = pathlib.Path(good).read_bytes()
        truncated.write_bytes(data[: len(data) // 2])
    strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(1)))  # a barrier
    out["truncated"] = attempt(nd.checkpoint.restore, str(truncated), model=model)
    # The file exists on "one host" only: worker 1 looks for it elsewhere.
    one_host = good if rank == 0 else str(folder / "elsewhere.pt")
    out["missing_on_one_worker"] = attempt(nd.checkpoint.restore, one_host, model=model)
    out["still_usable"] = attempt(nd.checkpoint.restore, good, model=model, total=total)
    # An integer SUM counter keeps its exact total through save, restore and assign (issue 23).
    with strategy.scope():
        seen = nd.Variable(0, synchronization="ON_READ", aggregation="SUM", dtype=torch.int64)
        restored = nd.Variable(0, synchronization="ON_READ", aggregation="SUM", dtype=torch.int64)
    strategy.run(lambda: seen.assign(4 + rank))  # 4 + 5 = 9 across the workers
    counted = str(folder / "counted.pt")
    nd.checkpoint.save(counted, seen=seen)
    nd.checkpoint.restore(counted, seen=restored)
    out["int_sum"] = {"saved": int(seen.read_value()), "restored": int(restored.read_value()),
                      "component": strategy.run(lambda: int(restored.read_value()))}
    restored.assign(5)
    out["int_sum"]["assigned"] = int(restored.read_value())
    report(out)
    strategy.shutdown()
