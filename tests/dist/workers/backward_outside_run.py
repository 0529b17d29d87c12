"""Worker script of tests/dist/test_backward_outside_run.py (`SCRIPT`)."""

import torch
import torch.nn.functional as F

from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    strategy, rank = start()
    out = {}


    def params(module):
        return [p.detach().tolist() for p in module.parameters()]


    def attempt(fn):
        try:
            fn()
        except Exception as error:
            return [type(error).__name__, str(error)]
        return None


    data = torch.Generator().manual_seed(100 + rank)  # each worker its own data
    X = torch.randn(4, 8, 10, generator=data)
    Y = torch.randint(0, 5, (4, 8), generator=data)

    torch.manual_seed(rank)
    with strategy.scope():  # the DDP tutorial's ToyModel: 10-10-5
        model = torch.nn.Sequential(
            torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    def target(y):
        return F.one_hot(y, 5).float()

    out["local_grads"] = [
        g.tolist()
        for g in torch.autograd.grad(loss_fn(model(X[0]), target(Y[0])), list(model.parameters()))
    ]

    # --- the literal port: a step at the top level, no strategy.run -------------------------------
    optimizer.zero_grad()
    loss_fn(model(X[0]), target(Y[0])).backward()
    out["grads"] = [p.grad.tolist() for p in model.parameters()]
    optimizer.step()
    out["after_one_step"] = params(model)
    # --- the same inside `with strategy.scope():` (cross-replica context) -------------------------
    with strategy.scope():
        optimizer.zero_grad()
        loss_fn(model(X[1]), target(Y[1])).backward()
        optimizer.step()
    out["after_scope_step"] = params(model)
    # --- then strategy.run steps, still together ---
    def step(x, y):
        optimizer.zero_grad()
        loss_fn(model(x), target(y)).backward()
        optimizer.step()
    for i in (2, 3):
        strategy.run(step, args=(X[i], Y[i]))
    out["after_run_steps"] = params(model)
    out["check_when_equal"] = attempt(lambda: strategy.check_replicas_identical())

    # --- parameters that differ anyway: named by the replica check ---
    with torch.no_grad():
        if rank == 1:
            model[2].bias[0] += 0.5
    out["check_when_different"] = attempt(lambda: strategy.check_replicas_identical())
    out["last_check"] = list(getattr(strategy, "last_replica_check", None) or [None])[1:]
    with torch.no_grad():  # copying replica 0's values by hand works
        [p.copy_(strategy.extended.broadcast_from_first(p)) for p in model.parameters()]
    out["check_after_fix"] = attempt(lambda: strategy.check_replicas_identical())
    # A diverged model the user replaced (created again) is still the strategy's: the fix the
    # message gives, strategy.realign_replicas(), covers it too.
    with strategy.scope():
        old = torch.nn.Linear(3, 3)
    with torch.no_grad():
        if rank == 1:
            old.bias[0] += 1.0
    del old
    out["check_replaced_model"] = attempt(lambda: strategy.check_replicas_identical())
    strategy.realign_replicas()
    out["check_after_realign"] = attempt(lambda: strategy.check_replicas_identical())

    # --- gradients written by hand (never averaged): caught within replica_check_every steps ------
    strategy.replica_check_every = 3
    steps_taken = []


    def hand_written_step(i):
        optimizer.zero_grad()
        grads = torch.autograd.grad(loss_fn(model(X[i]), target(Y[i])), list(model.parameters()))
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        optimizer.step()
        steps_taken.append(i)


    out["periodic"] = attempt(lambda: [hand_written_step(i) for i in range(4)])
    out["steps_before_periodic"] = len(steps_taken)
    with torch.no_grad():
        [p.copy_(strategy.extended.broadcast_from_first(p)) for p in model.parameters()]

    # --- DDP around a model made in scope: refused with the fix; around another model: as usual ---
    from torch.nn.parallel import DistributedDataParallel as DDP
    out["ddp_in_scope"] = attempt(lambda: DDP(model))
    out["ddp_plain"] = attempt(lambda: DDP(torch.nn.Linear(3, 3)))

    strategy.shutdown()
    report(out)
