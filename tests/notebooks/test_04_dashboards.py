"""notebooks/04-dashboards.ipynb runs end to end on real engines and shows what it teaches."""

import pytest

from nbdist.testing.kernels import cell_text, find_cell

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_dashboards(execute_notebook):
    nb = execute_notebook("04-dashboards")

    training = cell_text(find_cell(nb, "the straggler"))
    assert "[0] replica 0: final loss" in training
    assert "[1] replica 1: final loss" in training
    reading = cell_text(find_cell(nb, "data = board.refresh()"))
    assert "straggler: replica 1" in reading, reading  # the sleeping replica is named
    assert "(0, 'loss')" in reading and "(1, 'loss')" in reading  # nd.log reached the notebook
    saved = cell_text(find_cell(nb, "board.save("))
    size = int(saved.split(": ")[1].split(" bytes")[0])
    assert saved.startswith("saved dashboard-04.png") and size > 20_000, saved
    assert "no engine is left" in cell_text(find_cell(nb, "%dist stop"))
