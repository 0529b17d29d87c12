"""Worker script of tests/dist/test_checkpoint_workers.py (`MANAGER`)."""

import os
import pathlib

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    import nbdist.checkpoint.fileformat as fileformat

    strategy, rank = start(timeout_seconds=30)
    folder = pathlib.Path(os.environ["FOLDER"]) / "new" / "ckpts"  # missing: the writer makes it
    writes = []
    real_write = fileformat.write_atomic
    fileformat.write_atomic = lambda *a, **k: (writes.append(a[0]), real_write(*a, **k))
    import nbdist.checkpoint.save_restore as save_restore
    save_restore.write_atomic = fileformat.write_atomic
    torch.manual_seed(rank)  # different until the strategy mirrors them
    with strategy.scope():
        model = torch.nn.Linear(4, 2)
    manager = nd.checkpoint.CheckpointManager(folder, max_to_keep=2, model=model)
    paths = [os.path.basename(manager.save()) for _ in range(3)]
    out = {"paths": paths, "checkpoints": [os.path.basename(p) for p in manager.checkpoints],
           "files": sorted(os.listdir(folder)), "writes": len(writes)}
    strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(1)))  # a barrier
    with torch.no_grad():
        model.weight.zero_()
    again = nd.checkpoint.CheckpointManager(folder, max_to_keep=2, model=model)
    out["restored"] = os.path.basename(again.restore_or_initialize())
    out["weight_nonzero"] = bool(model.weight.abs().sum() > 0)
    out["next"] = os.path.basename(again.save())
    out["after"] = [os.path.basename(p) for p in again.checkpoints]
    blocked = pathlib.Path(os.environ["FOLDER"]) / "run.log"
    blocked.write_text("x")
    try:
        nd.checkpoint.CheckpointManager(blocked / "ckpts", model=model)
    except nd.CheckpointError as error:
        out["blocked"] = str(error)
    report(out)
    strategy.shutdown()
