"""Asynchronous training of the digits classifier with `ParameterServerStrategy`: the pieces
shared by `examples/parameter_server_digits.py`, the tests and the benchmark.

Each scheduled `train_steps` call reads the model from the ps tasks, takes `steps` SGD steps
on batches from its worker's own dataset, and sends the change back. `evaluate` runs on the
chief after `strategy.pull(model)`.

Example (needs a cluster, so not run here)::

    with strategy.scope():
        model = build_model()
    data = coordinator.create_per_worker_dataset(dataset_fn(batch_size=64))
    it = iter(data)
    for _ in range(40):
        coordinator.schedule(train_steps, args=(model, it))
    coordinator.join(); strategy.pull(model); print(evaluate(model))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbdist.app.datasets import load_digits

__all__ = ["build_model", "dataset_fn", "evaluate", "train_steps"]


def build_model(seed: int = 0, hidden: int = 64) -> torch.nn.Module:
    """A small MLP for 8×8 digits (64 → hidden → 10)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def dataset_fn(batch_size: int = 64, seed: int = 0) -> Callable[[], Iterator[Any]]:
    """A function building an endless iterator of shuffled training batches, seeded per
    worker process (each worker sees the data in its own order)."""

    def make() -> Iterator[Any]:
        data = load_digits(seed=0)
        generator = torch.Generator().manual_seed(seed * 1000 + os.getpid())

        def batches() -> Iterator[Any]:
            while True:
                order = torch.randperm(len(data.x_train), generator=generator)
                for start in range(0, len(order) - batch_size + 1, batch_size):
                    index = order[start : start + batch_size]
                    yield data.x_train[index], data.y_train[index]

        return batches()

    return make


def train_steps(model: torch.nn.Module, iterator: Iterator[Any], steps: int = 5, lr=0.2):
    """`steps` SGD steps on the worker's batches; returns the last loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x, y = next(iterator)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.detach()


def evaluate(model: torch.nn.Module) -> float:
    """Test accuracy of `model` (on the chief) on the held-out digits."""
    data = load_digits(seed=0)
    with torch.no_grad():
        return float((model(data.x_test).argmax(1) == data.y_test).float().mean())
