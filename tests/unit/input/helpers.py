"""Helpers shared by the tests of nbdist.input: distributing over logical CPU devices and reading
the per-replica components back.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from nbdist.core.values import PerReplica
from nbdist.input import distribute_dataset, distribute_datasets_from_function


def cpus(n: int) -> tuple[str, ...]:
    """The names of `n` logical CPU devices, e.g. `cpus(2) == ("cpu:0", "cpu:1")`."""
    return tuple(f"cpu:{i}" for i in range(n))


def dist(dataset, n=2, **kwargs):
    """`distribute_dataset` over `n` CPU devices (one worker unless `num_workers=` says more)."""
    kwargs.setdefault("num_replicas_in_sync", n * kwargs.get("num_workers", 1))
    return distribute_dataset(dataset, devices=cpus(n), **kwargs)


def from_fn(fn, n=2, **kwargs):
    """`distribute_datasets_from_function` over `n` CPU devices, as `dist` does."""
    kwargs.setdefault("num_replicas_in_sync", n * kwargs.get("num_workers", 1))
    return distribute_datasets_from_function(fn, devices=cpus(n), **kwargs)


def components(value) -> list[torch.Tensor]:
    """A PerReplica's components in replica order; a plain value as a list of one."""
    return list(value.values) if isinstance(value, PerReplica) else [value]


def assert_tensors(actual, expected) -> None:
    """Each tensor of `actual` equals the one of `expected` at its place (in `actual`'s dtype)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert torch.equal(a, torch.as_tensor(e, dtype=a.dtype)), (a, e)


def make_loader(samples=256, batch_size=64):
    """A DataLoader over `samples` rows of 3 features and a label, with its features and labels."""
    features = torch.arange(samples * 3, dtype=torch.float32).reshape(samples, 3)
    labels = torch.arange(samples) % 5
    return DataLoader(TensorDataset(features, labels), batch_size=batch_size), features, labels
