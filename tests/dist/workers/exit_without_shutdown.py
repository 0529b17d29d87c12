"""Worker script of tests/dist/test_exit_without_shutdown.py (`SCRIPT`)."""

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, _ = start()
    with strategy.scope():
        model = torch.nn.Linear(512, 512)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 512)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()   # gradients averaged in buckets
        optimizer.step()
        return nd.get_replica_context().all_reduce("sum", torch.ones(262145))

    for _ in range(3):
        total = strategy.run(step)
    report({"total": float(total[0])})
    # no strategy.shutdown(): the script just ends
