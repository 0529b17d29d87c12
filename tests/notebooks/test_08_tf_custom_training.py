"""notebooks/08-tf-custom-training.ipynb: TensorFlow's custom-training tutorial ported; the
recipe (`nd.compute_average_loss`, `nd.scale_regularization_loss`) applies the one-device
gradient (the formula written out, 0.5x), the replicas stay identical, the checkpoint restores."""

import re

import pytest

from nbdist.testing.kernels import cell_text, find_cell


@pytest.mark.timeout(300)
def test_tf_custom_training(execute_notebook):
    nb = execute_notebook("08-tf-custom-training")

    assert "Number of devices: 2" in cell_text(nb.cells[2])
    check = cell_text(find_cell(nb, "def gradients(inputs, written_out=False)"))
    assert "nd.compute_average_loss: gradient / one-device gradient = 1.0000 .. 1.0000" in check
    assert "written out: gradient / one-device gradient = 0.5000 .. 0.5000" in check
    training = cell_text(find_cell(nb, "def distributed_train_step"))
    accuracies = [float(a) for a in re.findall(r"Test Accuracy: ([\d.]+)%", training)]
    assert len(accuracies) == 6 and accuracies[-1] >= 90.0, training
    assert "replicas identical: True" in cell_text(find_cell(nb, "def fingerprint"))
    restored = cell_text(find_cell(nb, "new_model = create_model()"))
    assert f"restored ckpt-6.pt: test accuracy {accuracies[-1]:.2f}%" in restored
    assert "3 more steps, last loss" in cell_text(find_cell(nb, "distributed_train_step(next("))
