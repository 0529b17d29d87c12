"""Worker script of tests/dist/test_tf_loss_recipe.py (`RECIPE`)."""

import torch
import torch.nn.functional as F

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    GLOBAL_BATCH, STEPS, L2 = 16, 5, 0.01
    strategy, _ = start()
    g = torch.Generator().manual_seed(0)                    # the same global batches everywhere
    batches = [(torch.randn(GLOBAL_BATCH, 6, generator=g),
                torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)) for _ in range(STEPS)]
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)


    def compute_loss(labels, predictions):                  # TF's tutorial, in PyTorch
        per_example_loss = F.cross_entropy(predictions, labels, reduction="none")
        loss = nd.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)
        return loss + nd.scale_regularization_loss(L2 * model[0].weight.square().sum())


    def train_step(x, y):
        optimizer.zero_grad()
        loss = compute_loss(y, model(x))
        loss.backward()
        grads = [p.grad.tolist() for p in model.parameters()]
        optimizer.step()
        return loss.detach(), grads


    def literal_step(x, y):                                 # TF's formula without nd's functions
        model.zero_grad()
        per_example_loss = F.cross_entropy(model(x), y, reduction="none")
        loss = per_example_loss.sum() / GLOBAL_BATCH + L2 * model[0].weight.square().sum() / 2
        loss.backward()
        return [p.grad.tolist() for p in model.parameters()]


    out = {"losses": [], "grads": []}
    dataset = list(strategy.experimental_distribute_dataset(batches))
    out["literal_grads"] = strategy.run(literal_step, args=dataset[0])
    for x, y in dataset:
        loss, grads = strategy.run(train_step, args=(x, y))
        out["losses"].append(float(strategy.reduce("sum", loss, axis=None)))
        out["grads"].append(grads)
    out["params"] = [p.detach().tolist() for p in model.parameters()]

    # Outside run (a DDP-style step at the top of a script), where nbdist averages a backward over
    # the workers too: with global_batch_size the gradient is scaled by the 2 workers, without it
    # the loss is the worker's own mean (TF's one-replica default context).
    w = torch.ones(1, requires_grad=True)
    local = torch.arange(1.0, 5.0) + 4 * strategy.cluster_resolver.task_id   # [1..4] | [5..8]
    nd.compute_average_loss(w * local, global_batch_size=8).backward()
    out["outside_run_grad_given"] = w.grad.item()
    w.grad = None
    nd.compute_average_loss(w * local).backward()
    out["outside_run_grad_default"] = w.grad.item()
    strategy.shutdown()
    report(out)
