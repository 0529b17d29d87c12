"""Batches as nested structures: checking them, splitting them over replicas, empty stand-ins.

A batch is a nested structure (tuples, lists, dicts, namedtuples, as `torch.utils._pytree` sees
them) whose tensor leaves share a leading batch dimension. numpy arrays become tensors
(`torch.as_tensor`, no copy); Python and numpy scalars and strings are kept as they are and
given to every replica. Imports nbdist.input.errors only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nbdist._private_api import pytree
from nbdist.errors import NbdistWarning
from nbdist.input.errors import InputError, InputTypeError

__all__ = ["Batch", "EmptyReplicaBatchWarning", "empty_like", "split_batch", "warn_if_empty"]


class EmptyReplicaBatchWarning(NbdistWarning):
    """A global batch had too few examples to give every replica one (TensorFlow's rule: the
    last replicas get empty batches). A mean over an empty batch is `nan`; this warning says
    so instead of letting a `nan` loss pass silently."""


def warn_if_empty(bounds: list[tuple[int, int]], where: str) -> None:
    """Warn (`EmptyReplicaBatchWarning`, once per place as Python does) when a non-empty global
    batch split as `bounds` leaves some replica with no example, naming the replicas and the fix.

    Example:
        >>> warn_if_empty(split_batch(4, 2), "batch 0")  # every replica has rows: silent
    """
    rows = bounds[-1][1] - bounds[0][0] if bounds else 0
    empty = [replica for replica, (start, stop) in enumerate(bounds) if stop == start]
    if rows and empty:
        warnings.warn(
            f"{where} has {rows} example(s) for {len(bounds)} replicas, so replica(s) {empty} "
            "get an empty batch (TensorFlow's partial-batch rule); a mean over an empty batch "
            "is nan. Average per-example losses over the global batch (strategy.reduce(MEAN, "
            "per_example_loss, axis=0), or sum / global batch size), or drop the last partial "
            "batch (DataLoader(..., drop_last=True)).",
            EmptyReplicaBatchWarning,
            stacklevel=3,
        )

_PLAIN_LEAVES = (int, float, complex, bool, str, bytes, np.generic)


def split_batch(k: int, num_replicas: int) -> list[tuple[int, int]]:
    """The `(start, stop)` rows each replica takes from a batch of `k`, as TensorFlow splits it.

    With `b = ceil(k / num_replicas)`, replica `i` takes the next `min(b, max(0, k - i*b))`
    rows in order, so the last replicas may get empty slices.

    Raises:
        ValueError: `k` is negative or `num_replicas` is below 1.

    Example:
        >>> split_batch(7, 2)
        [(0, 4), (4, 7)]
        >>> split_batch(6, 4)
        [(0, 2), (2, 4), (4, 6), (6, 6)]
    """
    if k < 0 or num_replicas < 1:
        raise InputError(
            f"split_batch needs a batch size >= 0 and at least one replica, got k={k} and "
            f"num_replicas={num_replicas}."
        )
    step = -(-k // num_replicas)
    bounds, start = [], 0
    for replica in range(num_replicas):
        size = min(step, max(0, k - replica * step))
        bounds.append((start, start + size))
        start += size
    return bounds


def _leaf(path: tuple[Any, ...], leaf: Any, where: str) -> Any:
    if isinstance(leaf, (torch.Tensor, *_PLAIN_LEAVES)):
        return leaf
    if isinstance(leaf, np.ndarray):
        try:
            return torch.as_tensor(leaf)
        except TypeError:
            raise InputTypeError(
                f"{where} has a numpy array of dtype {leaf.dtype} at {_name(path)} that torch "
                f"cannot hold; convert it to numbers (or to a list of str) before distributing."
            ) from None
    raise InputTypeError(
        f"{where} has a leaf of type {type(leaf).__name__} at {_name(path)}; batches must be "
        f"nested tuples, lists, dicts or namedtuples of tensors, numpy arrays, Python scalars or "
        f"strings. Convert it to one of those, or register its type with "
        f"torch.utils._pytree.register_pytree_node."
    )


def _name(path: tuple[Any, ...]) -> str:
    return f"batch{pytree.keystr(path)}"


@dataclass(frozen=True)
class Batch:
    """A checked batch: its leaves (numpy converted), structure and shared leading size.

    Example:
        >>> batch = Batch.of({"x": torch.arange(4), "tag": "train"}, where="batch 0")
        >>> batch.rows, batch.take(1, 3)
        (4, {'x': tensor([1, 2]), 'tag': 'train'})
    """

    leaves: tuple[Any, ...]
    spec: pytree.TreeSpec
    rows: int | None  # None when the batch has no tensor leaf

    @classmethod
    def of(cls, structure: Any, *, where: str) -> Batch:
        """Check a batch and convert its numpy leaves.

        Raises:
            TypeError: a leaf is not a tensor, numpy array, scalar or string.
            ValueError: a tensor leaf is 0-dimensional, or tensor leaves disagree on the leading
                size (the message names every leaf and its size).
        """
        fast = _plain_tensors(structure)
        if fast is not None:
            return fast
        flat, spec = pytree.tree_flatten_with_path(structure)
        leaves = tuple(_leaf(path, leaf, where) for path, leaf in flat)
        sizes = {}
        for (path, _), leaf in zip(flat, leaves):
            if isinstance(leaf, torch.Tensor):
                if leaf.dim() == 0:
                    raise InputError(
                        f"{where} has a 0-dimensional tensor at {_name(path)} ({leaf!r}), which "
                        f"has no batch dimension to split over replicas; give it a leading "
                        f"batch dimension, or make it a Python scalar to pass it to every replica."
                    )
                sizes[_name(path)] = leaf.shape[0]
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{name}: {size}" for name, size in sizes.items())
            raise InputError(
                f"{where} has tensors with different leading (batch) sizes ({listed}); every "
                f"tensor of a batch must have the same size along dimension 0 so that it can be "
                f"split over the replicas."
            )
        rows = next(iter(sizes.values()), None)
        return cls(leaves, spec, rows)

    def take(self, start: int, stop: int) -> Any:
        """The structure with every tensor leaf sliced to rows `start:stop` (views, no copy)."""
        return pytree.tree_unflatten(
            [x[start:stop] if isinstance(x, torch.Tensor) else x for x in self.leaves], self.spec
        )

    def whole(self) -> Any:
        """The structure with its numpy leaves converted."""
        return pytree.tree_unflatten(list(self.leaves), self.spec)


def _plain_tensors(structure: Any) -> Batch | None:
    """`Batch.of(structure)` when every leaf is a plain tensor with a batch dimension and all
    share its size (the common `(x, y)` batch), else None (the full check, which names the
    leaf at fault, takes over).

    Note [Plain batches]: the full check flattens with key paths, only for its error messages,
    and that is most of a step's input cost (~60 of ~100 us per step on a 2-core machine for
    an `(x, y)` batch, the demo's). A batch with nothing to convert or report skips it: the
    same leaves, spec and rows as the full check gives.

    Example:
        >>> _plain_tensors((torch.zeros(4, 2), torch.zeros(4))).rows
        4
        >>> _plain_tensors((torch.zeros(4), 1)) is None  # a scalar leaf: the full check
        True
    """
    leaves, spec = pytree.tree_flatten(structure)
    rows = None
    for leaf in leaves:
        if type(leaf) is not torch.Tensor or leaf.dim() == 0:
            return None
        if rows is None:
            rows = leaf.shape[0]
        elif leaf.shape[0] != rows:
            return None
    if rows is None:
        return None
    return Batch(tuple(leaves), spec, rows)


def empty_like(batch: Batch) -> Any:
    """A stand-in for a replica without data: every tensor leaf gets 0 rows, same dtype and device.

    Example:
        >>> empty_like(Batch.of((torch.ones(3, 2), 5), where="batch 0"))
        (tensor([], size=(0, 2)), 5)
    """
    return pytree.tree_unflatten(
        [
            x.new_empty((0, *x.shape[1:])) if isinstance(x, torch.Tensor) else x
            for x in batch.leaves
        ],
        batch.spec,
    )
