"""Worker script of tests/dist/test_multi_worker_training.py (`STEPS`)."""

import warnings

import torch
import torch.nn.functional as F

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start()
    out = {}


    def params(module):
        return [p.detach().tolist() for p in module.parameters()]


    def local_grads(module, x, y):
        # This worker's own gradient, outside run (no accumulation into .grad, no averaging).
        loss = F.cross_entropy(module(x), y)
        return [g.tolist() for g in torch.autograd.grad(loss, list(module.parameters()))]


    data = torch.Generator().manual_seed(100 + rank)  # different data on each worker
    X = torch.randn(10, 16, 8, generator=data)
    Y = torch.randint(0, 3, (10, 16), generator=data)

    # --- synchronised: 10 steps on different data stay bit-identical ---
    torch.manual_seed(rank)  # different initial weights: the scope must broadcast worker 0's
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out["initial"] = params(model)
    out["local_grads_step0"] = local_grads(model, X[0], Y[0])


    def step(x, y, capture):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        grads = [p.grad.tolist() for p in model.parameters()] if capture else None
        optimizer.step()
        return loss.detach(), grads


    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = []
        for i in range(10):
            loss, grads = strategy.run(step, args=(X[i], Y[i], i == 0))
            losses.append(loss.item())
            if i == 0:
                out["synced_grads_step0"] = grads
    out["warnings_in_scope"] = [str(w.message) for w in caught]
    out["losses"] = losses
    out["final"] = params(model)

    # --- sync_gradients=False: broadcast at scope exit, but gradients stay local ---
    torch.manual_seed(10 + rank)
    with strategy.scope(sync_gradients=False):
        free = torch.nn.Linear(8, 3)
    out["free_initial"] = params(free)
    out["free_local_grads"] = local_grads(free, X[0], Y[0])


    def free_step(x, y):
        free.zero_grad()
        F.cross_entropy(free(x), y).backward()
        grads = [p.grad.clone() for p in free.parameters()]
        averaged = nd.get_replica_context().all_reduce("mean", grads)  # reduce them yourself
        return [g.tolist() for g in grads], [g.tolist() for g in averaged]


    out["free_grads"], out["free_averaged"] = strategy.run(free_step, args=(X[0], Y[0]))

    # --- a model created outside the scope, trained in run: one UserWarning -----------------------
    torch.manual_seed(0)
    outside = torch.nn.Linear(8, 3)
    outside_optimizer = torch.optim.SGD(outside.parameters(), lr=0.1)


    def outside_step(x, y):
        outside_optimizer.zero_grad()
        F.cross_entropy(outside(x), y).backward()
        outside_optimizer.step()


    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            strategy.run(outside_step, args=(X[i], Y[i]))
    out["outside_warnings"] = [[w.category.__name__, str(w.message)] for w in caught]

    strategy.shutdown()
    report(out)
