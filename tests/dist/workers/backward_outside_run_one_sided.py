"""Worker script of tests/dist/test_backward_outside_run.py (`ONE_SIDED`).

Run in each worker process by `nbdist.testing.run_workers` as `__main__`; importing it
runs nothing."""

import time

import torch

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    torch.set_num_threads(1)
    import nbdist as nd

    options = nd.experimental.CommunicationOptions(timeout_seconds=3)
    strategy = nd.MultiWorkerMirroredStrategy(communication_options=options)
    rank = strategy.cluster_resolver.task_id
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
