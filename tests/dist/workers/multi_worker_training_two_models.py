"""Worker script of tests/dist/test_multi_worker_training.py (`TWO_MODELS`)."""

import torch

from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start()
    with strategy.scope():
        first = torch.nn.Linear(4, 1)
    with strategy.scope():
        second = torch.nn.Linear(4, 1)
    x = torch.ones(2, 4) * (rank + 1)
    strategy.run(lambda: first(x).sum().backward())
    first_grad = first.weight.grad.clone()
    strategy.run(lambda: second(x).sum().backward())  # a separate backward, as in a GAN
    report({
        "first": first_grad.tolist(),
        "first_after": first.weight.grad.tolist(),
        "second": second.weight.grad.tolist(),
        "telemetry": [r.nbytes for r in strategy.extended.telemetry.records()
                      if r.op == "gradient_sync"],
    })
    strategy.shutdown()
