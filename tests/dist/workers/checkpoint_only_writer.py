"""Worker script of tests/dist/test_checkpoint_workers.py (`ONLY_WRITER`).

Run in each worker process by `nbdist.testing.run_workers` as `__main__`; importing it
runs nothing."""

import os
import pathlib
import time

import torch

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    torch.set_num_threads(1)
    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy(
        communication_options=nd.experimental.CommunicationOptions(timeout_seconds=5))
    rank = strategy.cluster_resolver.task_id
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
