"""Worker script of tests/dist/test_backward_outside_run.py (`ONE_SIDED`)."""

import time

import torch

from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start(timeout_seconds=3)
    with strategy.scope():
        model = torch.nn.Linear(4, 1)
    out = None
    if rank == 0:  # a backward on one worker only: it waits for the other, then names it
        start = time.perf_counter()
        try:
            model(torch.ones(2, 4)).sum().backward()
        except Exception as error:
            out = [type(error).__name__, str(error), time.perf_counter() - start]
    else:
        time.sleep(8)
    report(out)
