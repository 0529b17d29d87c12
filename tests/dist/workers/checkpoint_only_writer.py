"""Worker script of tests/dist/test_checkpoint_workers.py (`ONLY_WRITER`)."""

import os
import pathlib
import time

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start(timeout_seconds=5)
    done = pathlib.Path(os.environ["FOLDER"]) / "done"
    with strategy.scope():
        model = torch.nn.Linear(2, 2)
    out = {}
    if strategy.extended.should_checkpoint:  # the mistake: only the writer calls save
        started = time.monotonic()
        try:
            nd.checkpoint.save(os.path.join(os.environ["FOLDER"], "c.pt"), model=model)
            out = {"ok": True}
        except Exception as error:
            out = {"type": type(error).__name__, "message": str(error),
                   "elapsed": time.monotonic() - started}
        done.touch()
    else:  # stays alive (heartbeats) and takes no part
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    report(out)
