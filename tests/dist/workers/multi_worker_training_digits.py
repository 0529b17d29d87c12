"""Worker script of tests/dist/test_multi_worker_training.py (`DIGITS`)."""

import os

import torch
import torch.nn.functional as F
import torch.utils.data as tud

from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    GLOBAL_BATCH = 64
    strategy, _ = start()
    features, labels = torch.load(os.environ["DIGITS_PATH"])  # sklearn's digits, from the test
    index = torch.arange(len(labels))
    loader = tud.DataLoader(
        tud.TensorDataset(features, labels, index), batch_size=GLOBAL_BATCH, shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    torch.manual_seed(1234)
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


    def step(x, y):
        optimizer.zero_grad()
        # Scaled so that averaging over replicas gives the global batch's loss (TF's recipe): also
        # right for the last, partial batch (1797 = 28 * 64 + 5, split 3 | 2 over 2 workers).
        per_example = F.cross_entropy(model(x), y, reduction="none")
        loss = per_example.sum() * strategy.num_replicas_in_sync / GLOBAL_BATCH
        loss.backward()
        optimizer.step()
        return loss.detach()


    seen = []
    dist_loader = strategy.experimental_distribute_dataset(loader)
    for _epoch in range(2):
        for x, y, i in dist_loader:
            strategy.run(step, args=(x, y))
            seen.append(i.tolist())
    report({
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "steps": len(dist_loader),
        "seen": seen,
        "params": [p.detach().tolist() for p in model.parameters()],
    })
    strategy.shutdown()
