"""`nd.datasets.load_digits()`: the bundled digits under one public name (issue 22, item 3);
the examples and notebooks use it and need no scikit-learn."""

from __future__ import annotations

import pathlib

import pytest
import torch

import nbdist as nd

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_load_digits_is_public_stratified_and_fixed_by_seed():
    data = nd.datasets.load_digits(seed=3)
    assert isinstance(data, nd.datasets.Digits)
    assert data.x_train.shape == (1437, 64) and data.x_test.shape == (360, 64)
    assert data.x_train.dtype == torch.float32 and float(data.x_train.max()) == 1.0
    per_class = torch.bincount(torch.cat([data.y_train, data.y_test]))
    assert ((torch.bincount(data.y_test) - 0.2 * per_class).abs() < 1).all()  # stratified
    assert torch.equal(nd.datasets.load_digits(seed=3).y_test, data.y_test)
    from nbdist.app.data import load_digits  # the demo's name is the same function

    assert load_digits is nd.datasets.load_digits
    with pytest.raises(ValueError, match="test_fraction must be between 0 and 1"):
        nd.datasets.load_digits(test_fraction=1.5)


def test_examples_and_notebooks_use_the_public_loader_and_no_scikit_learn():
    texts = {p.name: p.read_text() for p in [*ROOT.glob("examples/*.py"),
                                             *ROOT.glob("notebooks/*.ipynb")]}  # fmt: skip
    assert not [name for name, text in texts.items() if "sklearn" in text]
    assert not [name for name, text in texts.items() if "nbdist.app.data" in text]
    assert not [name for name, text in texts.items() if "load_digits_data" in text]
    assert "nd.datasets.load_digits" in texts["train_digits.py"]
    assert "scikit-learn" not in (ROOT / "examples" / "README.md").read_text().replace(
        "no scikit-learn", ""
    )
