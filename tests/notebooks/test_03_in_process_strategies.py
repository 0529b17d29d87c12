"""notebooks/03-in-process-strategies.ipynb: aggregation, merge_call, both strategies."""

import pytest

from nbdist.testing.kernels import cell_text, find_cell


@pytest.mark.timeout(600)
def test_in_process_strategies(execute_notebook):
    nb = execute_notebook("03-in-process-strategies")

    variables = cell_text(find_cell(nb, "def add_my_id"))
    assert "MirroredVariable SyncOnReadVariable" in variables
    assert "mirrored SUM: 3.0" in variables
    assert "read across replicas: 2.0" in variables
    assert "tensor(10.)" in cell_text(find_cell(nb, "merged = mirrored.run"))  # (0 + 1) * 10
    assert "same weights: True" in cell_text(find_cell(nb, "def train(strategy)"))
