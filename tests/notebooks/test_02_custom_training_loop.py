"""notebooks/02-custom-training-loop.ipynb trains to a useful accuracy and restores a checkpoint."""

import re

import pytest

from nbdist.testing.kernels import cell_text, find_cell


@pytest.mark.timeout(600)
def test_custom_training_loop(execute_notebook):
    nb = execute_notebook("02-custom-training-loop")

    training = cell_text(find_cell(nb, "for epoch in range(6)"))
    accuracies = [float(a) for a in re.findall(r"test accuracy ([\d.]+)%", training)]
    assert len(accuracies) == 6
    assert accuracies[-1] >= 93.0, training
    restore = cell_text(find_cell(nb, "nd.checkpoint.restore"))
    assert "restored: True" in restore
    assert f"after restore: {accuracies[-1]:.2f}%" in restore
