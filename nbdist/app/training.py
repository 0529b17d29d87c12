"""The demo's model and the engine side of its training job.

These functions run inside each engine (sent by reference: the engines import this module),
with the engine's `MultiWorkerMirroredStrategy`. `setup` builds the CNN and its optimizer in
the strategy's scope (parameters broadcast from rank 0), `epoch_iterator` shards one shuffled
epoch of global batches by replica, `train_step` runs in replica context (gradients averaged
in buckets during `backward()`), `evaluate` scores the replica's share of the test set.

Example (one process, a single-worker strategy):
    >>> import nbdist as nd
    >>> from nbdist.app import training
    >>> strategy = nd.MultiWorkerMirroredStrategy()  # doctest: +SKIP
    >>> training.setup(strategy, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from nbdist.app.datasets import load_digits

__all__ = [
    "GLOBAL_BATCH_SIZE",
    "all_epochs_iterator",
    "build_model",
    "collective_records",
    "epoch_iterator",
    "epoch_report",
    "evaluate",
    "parameter_checksum",
    "setup",
    "step_losses",
    "train_step",
]

GLOBAL_BATCH_SIZE = 64
LEARNING_RATE = 1e-2
_job: dict[str, Any] = {}


def build_model() -> torch.nn.Module:
    """A small CNN for 8×8 digits: two 3×3 conv blocks (16, 32 channels), then 128 → 10.

    Example:
        >>> build_model()(torch.zeros(2, 64)).shape
        torch.Size([2, 10])
    """
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8, 8)),
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )


def setup(strategy: Any, seed: int = 0) -> dict[str, int]:
    """Load the data and build the model and optimizer in `strategy.scope()` (cross-replica).

    Returns the sizes the driver needs: training/test images and steps per epoch.
    """
    torch.manual_seed(seed)
    data = load_digits(seed)
    with strategy.scope():
        model = build_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    steps = -(-len(data.x_train) // GLOBAL_BATCH_SIZE)
    _import_step_modules()
    _job.clear()
    _job.update(strategy=strategy, data=data, model=model, optimizer=optimizer, seed=seed,
                step_losses=[], steps_per_epoch=steps)  # fmt: skip
    return {"train": len(data.x_train), "test": len(data.x_test), "steps_per_epoch": steps}


def _import_step_modules() -> None:
    """Import what the first step would import lazily (the distributed input, the replica
    context's functions, `nd.log`): ~40 ms on 2 cores that the first timed step would pay,
    where a script pays its imports before its loop (benchmarks/bench_training.py times both
    from the first step)."""
    import nbdist as nd
    import nbdist.input  # experimental_distribute_dataset imports it lazily

    for name in ("get_replica_context", "log"):  # lazy attributes: resolving one imports it
        getattr(nd, name)


def trained_model() -> torch.nn.Module:
    """The model `setup` built, so the driver can name it in the engine's namespace (the
    dashboard's placement view counts what the namespace holds)."""
    return _job["model"]


def epoch_iterator(epoch: int) -> Any:
    """An iterator over one epoch's global batches (same shuffle on every engine), sharded."""
    data, strategy = _job["data"], _job["strategy"]
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(
        _job["seed"] * 1000 + epoch))  # fmt: skip
    batches = [
        (data.x_train[idx], data.y_train[idx]) for idx in order.split(GLOBAL_BATCH_SIZE)
    ]
    return iter(strategy.experimental_distribute_dataset(batches))


def all_epochs_iterator(epochs: int) -> Any:
    """The global batches of epochs 1..`epochs`, one after another (each epoch shuffled as
    `epoch_iterator` does), so the driver needs no round trip to start an epoch."""
    for epoch in range(1, epochs + 1):
        yield from epoch_iterator(epoch)


def epochs_with_reports(epochs: int) -> Any:
    """`all_epochs_iterator`'s batches, each paired with 0, except each epoch's last batch,
    paired with the epoch's step count: `train_and_report` then returns the epoch's report
    from that step, so one `run_steps` call trains a whole epoch and scores it."""
    steps = _job["steps_per_epoch"]
    for index, batch in enumerate(all_epochs_iterator(epochs)):
        yield batch, steps if (index + 1) % steps == 0 else 0


def train_and_report(item: tuple[Any, int]) -> torch.Tensor:
    """`train_step` on `item`'s batch; on an epoch's last batch (`item[1]` > 0, the epoch's
    step count) it returns `epoch_report` instead of the step's totals."""
    batch, report_steps = item
    totals = train_step(batch)
    return epoch_report(report_steps) if report_steps else totals


def epoch_report(steps: int) -> torch.Tensor:
    """(correct, count, mean loss of the last `steps` steps) on this replica (replica context):
    the test score of `evaluate` and the epoch's loss in one round trip."""
    losses = _job["step_losses"][-steps:]
    scores = evaluate()
    return torch.cat([scores, torch.tensor([sum(losses) / max(len(losses), 1)])])


def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One step on this replica's slice; returns the global batch's (loss sum, count)."""
    import nbdist as nd

    x, y = batch
    model, optimizer = _job["model"], _job["optimizer"]
    replicas = nd.get_replica_context().num_replicas_in_sync
    losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
    # Sum over the slice over the per-replica share of the global batch: with gradients
    # averaged over replicas, the step follows the global batch's mean loss.
    loss = losses.sum() * replicas / GLOBAL_BATCH_SIZE
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    totals = torch.stack([losses.detach().sum(), torch.tensor(float(len(y)))])
    totals = nd.get_replica_context().all_reduce("sum", totals)
    _job["step_losses"].append(float(totals[0] / totals[1]))
    nd.log(step=len(_job["step_losses"]), loss=_job["step_losses"][-1])
    return totals


def evaluate() -> torch.Tensor:
    """(correct, count) on this replica's share of the test set (replica context)."""
    import nbdist as nd

    context = nd.get_replica_context()
    data, model = _job["data"], _job["model"]
    rank, size = context.replica_id_in_sync_group, context.num_replicas_in_sync
    x, y = data.x_test[rank::size], data.y_test[rank::size]
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum()
    nd.log(step=len(_job["step_losses"]), test_accuracy=float(correct) / max(len(y), 1))
    return torch.stack([correct.float(), torch.tensor(float(len(y)))])


def parameter_checksum() -> torch.Tensor:
    """A float64 sum of every parameter: equal on every replica when they are in sync."""
    return sum(p.detach().double().sum() for p in _job["model"].parameters())


def step_losses() -> list[float]:
    """The global batch's mean loss of every step so far (the same on every engine)."""
    return list(_job["step_losses"])


def collective_records() -> list[Any]:
    """This engine's telemetry records (`strategy.extended.telemetry.records()`)."""
    return list(_job["strategy"].extended.telemetry.records())
