"""Data-parallel training of a digit classifier with nbdist, the tf.distribute way.

Trains an MLP (64 pixels → 128 → 10 digits) on the 8×8 digits images bundled with nbdist with a
`MirroredStrategy` over two logical CPU replicas: every step, each replica takes half of the
global batch of 64, computes its gradients, nbdist averages them across replicas, and both
copies of the model take the same optimizer step. Needs nothing beyond nbdist; no download.

    python examples/train_digits.py                       # 8 epochs on cpu:0, cpu:1
    python examples/train_digits.py --strategy central --epochs 3 --optimizer adam
    python examples/train_digits.py --strategy one --devices cpu:0

This is the loop `python -m nbdist demo` runs, written out to read; the data come from
`nd.datasets.load_digits()`, the options and the dashboard picture from `nbdist.app.demo`. Also
importable: `main(["--epochs", "1"])` returns the results as a dict.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

import nbdist as nd
from nbdist.app import demo

GLOBAL_BATCH_SIZE = 64  # examples per step, over all replicas


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = demo.add_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.set_defaults(out=Path("artifacts") / "train_digits.png")
    args = parser.parse_args(argv)
    demo.check_arguments(parser, args)
    torch.manual_seed(args.seed)

    # 1. Data: 1,437 training and 360 test images, features in [0, 1].
    x_train, y_train, x_test, y_test = nd.datasets.load_digits(seed=args.seed)

    # 2. The strategy: which devices run replicas, and where the variables live.
    devices = list(args.devices or ["cpu:0", "cpu:1"])
    if args.strategy == "mirrored":
        strategy = nd.MirroredStrategy(devices)  # a copy of the model per device
    elif args.strategy == "central":
        strategy = nd.CentralStorageStrategy(devices)  # one copy, on the CPU
    else:
        strategy = nd.OneDeviceStrategy(devices[0])
    replicas = strategy.num_replicas_in_sync

    # 3. Model and optimizer are created in the strategy's scope, so their parameters become
    #    the strategy's variables: placed on (mirrored over) its devices, gradients averaged.
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )
        if args.optimizer == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=args.lr or 0.1, momentum=0.9)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr or 3e-3)

    # 4. An ordinary DataLoader of *global* batches; the distributed dataset splits each batch
    #    over the replicas (32 + 32) and puts each slice on its replica's device.
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=GLOBAL_BATCH_SIZE,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    dataset = strategy.experimental_distribute_dataset(loader)

    # 5. One training step, run by every replica on its own slice of the batch.
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        # nbdist averages the replicas' gradients, so scale this replica's summed loss by its
        # share of the global batch: the step then follows the mean loss over the global batch
        # (TF's compute_average_loss), and an empty slice contributes zero, not NaN.
        loss = losses.sum() / (GLOBAL_BATCH_SIZE / replicas)
        optimizer.zero_grad()
        loss.backward()  # gradients are averaged across replicas here
        optimizer.step()  # so every replica's copy takes the same step
        return losses.detach()  # per-example losses: a PerReplica value

    def test_accuracy() -> float:
        device = next(model.parameters()).device
        with strategy.scope(), torch.no_grad():  # cross-replica context: one model
            predicted = model(x_test.to(device)).argmax(dim=1).cpu()
        return (predicted == y_test).float().mean().item()

    print(f"{demo.describe(strategy)}, global batch {GLOBAL_BATCH_SIZE}, {args.epochs} epochs")
    step_losses, epoch_losses, accuracies = [], [], []
    started = time.perf_counter()
    with tqdm(
        total=args.epochs * len(dataset), unit="step", mininterval=1.0, disable=not args.progress
    ) as bar:  # on stderr; mininterval keeps CI logs short
        for epoch in range(1, args.epochs + 1):
            total, count = 0.0, 0
            for x, y in dataset:
                losses = strategy.run(train_step, args=(x, y))
                # Sum the per-example losses of every replica; count the examples.
                batch_total = strategy.reduce("sum", losses, axis=0).item()
                batch_count = sum(len(part) for part in strategy.experimental_local_results(y))
                step_losses.append(batch_total / batch_count)
                total, count = total + batch_total, count + batch_count
                bar.update()
                bar.set_postfix(loss=f"{step_losses[-1]:.3f}", refresh=False)
            epoch_losses.append(total / count)
            accuracies.append(test_accuracy())
            tqdm.write(
                f"epoch {epoch}/{args.epochs}  loss {epoch_losses[-1]:.4f}  "
                f"test accuracy {accuracies[-1]:.2%}"
            )
    seconds = time.perf_counter() - started
    print(f"final test accuracy: {accuracies[-1]:.2%} in {seconds:.1f} s")

    # 6. What the collectives did: every gradient all-reduce is recorded with its duration and
    #    how long each replica waited for the others.
    records = strategy.extended.telemetry.records()
    telemetry = demo.summarize_telemetry(records)
    if records:
        print(demo.telemetry_line(telemetry))
    if args.out is not None:
        title = f"{demo.describe(strategy)}: test accuracy {accuracies[-1]:.1%}"
        path = demo.plot_dashboard(
            step_losses, accuracies, records, args.out, title=title, start=started,
            steps_per_epoch=len(dataset),
        )  # fmt: skip
        print(f"dashboard: {path}")
    return {
        "accuracy": accuracies[-1],
        "epoch_losses": epoch_losses,
        "epoch_accuracies": accuracies,
        "step_losses": step_losses,
        "steps": len(step_losses),
        "seconds": seconds,
        "telemetry": telemetry,
    }


if __name__ == "__main__":
    main()
