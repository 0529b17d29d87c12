"""notebooks/05-multi-host.ipynb: torchrun, TF_CONFIG and engines: one step, the same weights."""

import pytest

from nbdist.testing.kernels import cell_text, find_cell

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_multi_host(execute_notebook):
    nb = execute_notebook("05-multi-host")

    assert "RESULT 0" in cell_text(find_cell(nb, "torch.distributed.run"))
    assert "RESULT 1" in cell_text(find_cell(nb, "TF_CONFIG"))
    final = cell_text(find_cell(nb, "same = ("))
    assert "same weights under torchrun, TF_CONFIG and the engines: True" in final
