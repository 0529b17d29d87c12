"""notebooks/01-quickstart.ipynb runs end to end on real engines and shows what it teaches."""

import pytest

from nbdist.testing.kernels import cell_text, find_cell

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_quickstart(execute_notebook):
    nb = execute_notebook("01-quickstart")

    hello = cell_text(find_cell(nb, "hello from replica"))
    assert "[0] hello from replica 0 of 2" in hello
    assert "[1] hello from replica 1 of 2" in hello
    assert "PerReplica (0, 10)" in cell_text(find_cell(nb, "per_replica = _"))
    training = cell_text(find_cell(nb, "for epoch in range(60)"))
    assert "epoch 60: loss" in training
    assert "replicas identical: True" in cell_text(find_cell(nb, "checksums = _.values"))
    assert "alive" in cell_text(find_cell(nb, "%dist status"))
    assert "no engine is left" in cell_text(find_cell(nb, "%dist stop"))
