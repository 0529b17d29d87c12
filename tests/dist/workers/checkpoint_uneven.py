"""Worker script of tests/dist/test_checkpoint_workers.py (`UNEVEN`)."""

import os

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start(timeout_seconds=30)
    with strategy.scope():
        model = torch.nn.Linear(2, 2)
    data = [torch.full((4, 2), float(i)) for i in range(6)]
    iterator = iter(strategy.experimental_distribute_dataset(data))
    next(iterator)
    if rank == 0:
        next(iterator)  # worker 0 is one batch ahead of worker 1
    path = os.path.join(os.environ["FOLDER"], "uneven.pt")
    out = {}
    try:
        nd.checkpoint.save(path, model=model, iterator=iterator)
        out["save"] = {"ok": True}
    except Exception as error:
        out["save"] = {"type": type(error).__name__, "message": str(error),
                       "bases": [c.__name__ for c in type(error).__mro__]}
    out["written"] = os.path.exists(path)
    if rank == 1:
        next(iterator)  # the same step on both: now the save goes through
    nd.checkpoint.save(path, model=model, iterator=iterator)
    out["saved_batches"] = nd.checkpoint.read(path)["iterator"]["batches"]
    report(out)
    strategy.shutdown()
