"""Data sets bundled with nbdist, for examples, notebooks and tests (no download, no
scikit-learn).

`load_digits()`: the UCI "Optical Recognition of Handwritten Digits" images as scikit-learn
distributes them (1,797 8×8 images of the digits 0-9, CC BY 4.0; see
`nbdist/app/data/README.md`), 45 kB shipped in the wheel, scaled to [0, 1] and split into
training and test sets, stratified by class.

Example:
    >>> import nbdist as nd
    >>> data = nd.datasets.load_digits(seed=0)
    >>> data.x_train.shape, data.x_test.shape, float(data.x_train.max())
    (torch.Size([1437, 64]), torch.Size([360, 64]), 1.0)
"""

from __future__ import annotations

import math
from importlib import resources
from typing import NamedTuple

import numpy as np
import torch

from nbdist.errors import InvalidArgumentError

__all__ = ["Digits", "load_digits", "raw_digits"]


class Digits(NamedTuple):
    """The digits split for training: features scaled to [0, 1], labels 0-9 (int64)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def raw_digits() -> tuple[np.ndarray, np.ndarray]:
    """The bundled images (uint8, 1797×64, values 0..16) and labels (uint8, 0..9).

    Example:
        >>> images, labels = raw_digits()
        >>> images.shape, int(labels.max())
        ((1797, 64), 9)
    """
    # The file ships in nbdist/app/data/ (the wheel's package data); reading it imports nothing.
    with resources.files("nbdist").joinpath("app", "data", "digits.npz").open("rb") as file:
        bundle = np.load(file)
        return bundle["images"], bundle["labels"]


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> Digits:
    """The digits, scaled by 1/16, split into training and test sets, stratified by class.

    Every digit appears in the same proportion on both sides (within one image); the split is
    fixed by `seed`.

    Example:
        >>> a, b = load_digits(seed=1), load_digits(seed=1)
        >>> bool(torch.equal(a.y_test, b.y_test))
        True
    """
    if not 0 < test_fraction < 1:
        raise InvalidArgumentError(
            f"test_fraction must be between 0 and 1, got {test_fraction!r}; e.g. 0.2 keeps "
            "a fifth of the images for testing."
        )
    images, labels = raw_digits()
    rng = np.random.default_rng(seed)
    n_test = math.ceil(len(labels) * test_fraction)
    classes = np.unique(labels)
    members = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    # Largest-remainder allocation of the test images over the classes.
    exact = np.array([len(m) * n_test / len(labels) for m in members])
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts))[: n_test - counts.sum()]:
        counts[i] += 1
    test = np.concatenate([m[:k] for m, k in zip(members, counts)])
    train = np.concatenate([m[k:] for m, k in zip(members, counts)])
    test, train = rng.permutation(test), rng.permutation(train)
    x = torch.from_numpy(images.astype(np.float32) / 16.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return Digits(x[train], y[train], x[test], y[test])
