"""Multi-worker data-parallel training of a digit classifier with `MultiWorkerMirroredStrategy`.

The same file runs unchanged as two worker processes started by torchrun, as two processes
given TensorFlow's `TF_CONFIG`, or as one plain process (a single worker). Each worker holds
one replica (its GPU, or one CPU replica); every step each worker reads only its half of the
global batch of 64, nbdist averages the gradients across the workers during `backward()`, and
every worker's copy of the model takes the same optimizer step. Rank 0 prints the loss of each
epoch and the final test accuracy. Uses the digits data bundled with nbdist (no scikit-learn, no
download). Run from the repository root with the virtual environment active:

    # (a) torchrun, two workers on this machine
    torchrun --nproc-per-node 2 examples/multi_worker_digits.py --epochs 4

    # (b) TF_CONFIG: one shell per worker (same cluster, different task index); the first
    #     worker's address is the rendezvous
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
                "task": {"type": "worker", "index": 0}}' python examples/multi_worker_digits.py
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
                "task": {"type": "worker", "index": 1}}' python examples/multi_worker_digits.py

    # (c) one plain process: a single worker
    python examples/multi_worker_digits.py

    # gradients sent at half width
    torchrun --nproc-per-node 2 examples/multi_worker_digits.py --compression bf16

    # a checkpoint after every epoch; run again (on any number of workers) to resume from it
    torchrun --nproc-per-node 2 examples/multi_worker_digits.py --epochs 2 --checkpoint ckpt.pt
    torchrun --nproc-per-node 3 examples/multi_worker_digits.py --epochs 4 --checkpoint ckpt.pt

All three print the same per-epoch losses and the same final accuracy (the two-worker runs
bit for bit; the single worker up to float rounding, since it sums the batch in another order).
A run resumed from a checkpoint continues with the losses of an uninterrupted run (up to float
rounding when the number of workers changed): the global batch stays 64, and the checkpoint
holds the shuffle generator's state, so the next epoch draws the same order.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, TensorDataset

import nbdist as nd

GLOBAL_BATCH_SIZE = 64  # examples per step, over all workers


def is_chief(strategy: nd.MultiWorkerMirroredStrategy) -> bool:
    """Whether this process is rank 0: the chief, or worker 0 when there is no chief.

    A single worker (no cluster) has no task type and is its own chief.
    """
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_type == "chief":
        return True
    jobs = resolver.cluster_spec().jobs
    return task_type == "worker" and not task_id and "chief" not in jobs


def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="passes over the training data")
    parser.add_argument(
        "--compression",
        choices=("none", "bf16", "fp16"),
        default="none",
        help="width at which gradients travel between workers",
    )
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="model, split and shuffle seed")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="file saved after every epoch, and resumed from when it exists",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    torch.manual_seed(args.seed)

    # 1. The strategy finds the cluster itself: TF_CONFIG, then torchrun's variables, else
    #    a single worker. Creating it joins every worker into one process group.
    compression = None if args.compression == "none" else args.compression
    strategy = nd.MultiWorkerMirroredStrategy(
        communication_options=nd.experimental.CommunicationOptions(compression=compression)
    )
    chief = is_chief(strategy)
    replicas = strategy.num_replicas_in_sync

    def say(text: str) -> None:
        if chief:
            print(text, flush=True)

    # 2. Data: 1,437 training and 360 test images, features in [0, 1]. Every worker builds the
    #    same DataLoader of *global* batches (the seeded generator gives every worker the same
    #    shuffle); the distributed dataset makes each worker read only its replicas' rows.
    x_train, y_train, x_test, y_test = nd.datasets.load_digits(seed=args.seed)
    shuffle = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=GLOBAL_BATCH_SIZE,
        shuffle=True,
        generator=shuffle,
    )
    dataset = strategy.experimental_distribute_dataset(loader)

    # 3. Model and optimizer in the scope: parameters are broadcast from rank 0 when the scope
    #    exits, and their gradients are averaged across workers after every backward().
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # 4. One training step, run by every replica on its slice of the batch.
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        # Gradients are averaged over the replicas, so scale this replica's summed loss by its
        # share of the global batch: the update follows the mean loss over the global batch.
        loss = losses.sum() / (GLOBAL_BATCH_SIZE / replicas)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # Summed loss and example count of this replica, reduced across replicas below.
        return torch.stack([losses.detach().sum(), torch.tensor(float(len(y)))])

    say(
        f"{type(strategy).__name__}: {replicas} replica(s) ({strategy.extended.worker_devices[0]} "
        f"on each worker), global batch {GLOBAL_BATCH_SIZE}, compression {args.compression}, "
        f"{args.epochs} epoch(s)"
    )
    # 5. Resume from a checkpoint (every worker restores; any number of workers). It holds
    #    the shuffle generator, so the next epoch draws the order an uninterrupted run would.
    state = {"model": model, "optimizer": optimizer, "shuffle": shuffle}
    progress = {"epoch": 0}
    if args.checkpoint and os.path.exists(args.checkpoint):
        nd.checkpoint.restore(args.checkpoint, progress=progress, **state)
        say(f"resumed from {args.checkpoint} after epoch {progress['epoch']}")
    for epoch in range(progress["epoch"] + 1, args.epochs + 1):
        totals = torch.zeros(2)
        for x, y in dataset:
            per_replica = strategy.run(step, args=(x, y))
            totals += strategy.reduce("sum", per_replica, axis=None).cpu()
        say(f"epoch {epoch}/{args.epochs}  loss {totals[0] / totals[1]:.6f}")
        if args.checkpoint:  # every worker calls save; the first writes, atomically
            nd.checkpoint.save(args.checkpoint, progress={"epoch": epoch}, **state)

    # 6. Rank 0 evaluates its copy (every worker's copy is bit-identical after each step).
    accuracy = float("nan")
    if chief:
        with torch.no_grad():
            device = next(model.parameters()).device
            predicted = model(x_test.to(device)).argmax(dim=1).cpu()
        correct = int((predicted == y_test).sum())
        accuracy = correct / len(y_test)
        say(f"final test accuracy: {accuracy:.6f} ({correct}/{len(y_test)})")

    strategy.shutdown()  # leave the process group (every worker)
    return accuracy


if __name__ == "__main__":
    main()
