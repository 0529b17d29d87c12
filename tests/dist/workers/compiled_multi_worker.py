"""Worker script of tests/dist/test_compiled_multi_worker.py (`CODE`)."""

import torch
import torch.nn.functional as F

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    from nbdist.errors import CompiledCollectiveError

    strategy, rank = start()
    STEPS, PER_WORKER = 5, 16
    data = torch.Generator().manual_seed(7)
    X = torch.randn(STEPS, 2 * PER_WORKER, 8, generator=data)
    Y = torch.randint(0, 3, (STEPS, 2 * PER_WORKER), generator=data)


    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


    def compiled_step(model, optimizer):
        def step(x, y):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss
        return torch.compile(step, backend="aot_eager")


    # one process, the global batch: the reference
    reference = make()
    ref_step = compiled_step(reference, torch.optim.SGD(reference.parameters(), lr=0.2))
    for x, y in zip(X, Y):
        ref_step(x, y)

    with strategy.scope():
        model = make()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    step = compiled_step(model, optimizer)
    snapshots = []
    for x, y in zip(X, Y):
        mine = slice(rank * PER_WORKER, (rank + 1) * PER_WORKER)
        strategy.run(step, args=(x[mine], y[mine]))
        snapshots.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist())
    diff = max(
        (a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters())
    )

    body = torch.compile(
        lambda t: nd.get_replica_context().all_reduce("sum", t), backend="aot_eager", fullgraph=True
    )
    try:
        strategy.run(body, args=(torch.ones(2),))
        refused = None
    except CompiledCollectiveError as error:
        refused = str(error)
    after = strategy.run(
        lambda t: nd.get_replica_context().all_reduce("sum", t), args=(torch.ones(2),)
    )
    report({"snapshots": snapshots, "diff": diff, "refused": refused, "after": after.tolist()})
