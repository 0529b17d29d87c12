"""Worker script of tests/dist/test_dashboard_stuck.py (`WORKER`)."""

import os
import pickle
import threading
import time
from pathlib import Path

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    folder = Path(os.environ["STUCK_DIR"])
    strategy, rank = start()
    telemetry = strategy.extended.telemetry
    done = threading.Event()


    def publish():  # what the engine feed ships: the marks of the collectives in progress
        while True:
            finished = done.is_set()  # one more write after the all_reduce: nothing in progress
            tmp = folder / f"pending{rank}.tmp"
            tmp.write_bytes(pickle.dumps(telemetry.tail(0, 0)["pending"]))
            tmp.replace(folder / f"pending{rank}.pkl")
            if finished:
                return
            done.wait(0.1)


    publisher = threading.Thread(target=publish)
    publisher.start()
    if rank == 1:
        deadline = time.monotonic() + 120
        while not (folder / "release").exists():
            assert time.monotonic() < deadline, "the test never released worker 1"
            done.wait(0.1)
    total = strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(4)))
    done.set()
    publisher.join(timeout=30)
    report(float(total.sum()))
    strategy.shutdown()
