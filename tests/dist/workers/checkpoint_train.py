"""Worker script of tests/dist/test_checkpoint_workers.py (`TRAIN`)."""

import os

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    from torch.utils.data import DataLoader, TensorDataset

    PHASE, CKPT = os.environ["PHASE"], os.environ["CKPT"]
    STEPS, SAVE_AT, GLOBAL_BATCH = int(os.environ["STEPS"]), int(os.environ["SAVE_AT"]), 12

    strategy, _ = start()
    data = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * GLOBAL_BATCH, 5, generator=data)
    y = x @ torch.randn(5, 2, generator=data)
    # A plain DataLoader over a map-style dataset: sharded by index across workers; its shuffled
    # order comes from a generator seeded the same on every worker and in every launch.
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(7))
    torch.manual_seed(1)
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        seen = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
    iterator = iter(strategy.experimental_distribute_dataset(loader))


    def step(batch):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen.assign_add(float(len(inputs)))


    objects = dict(model=model, optimizer=optimizer, seen=seen, iterator=iterator)
    if PHASE == "resume":
        nd.checkpoint.restore(CKPT, **objects)
    start = SAVE_AT if PHASE == "resume" else 0
    stop = SAVE_AT if PHASE == "first" else STEPS
    for _ in range(start, stop):
        strategy.run(step, args=(next(iterator),))
    if PHASE == "first":
        nd.checkpoint.save(CKPT, **objects)
    left = sum(1 for _ in iterator)
    report({
        "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
        "seen": float(seen.read_value()),
        "left": left,
        "ckpt_exists_after_save": os.path.exists(CKPT),
    })
    strategy.shutdown()
