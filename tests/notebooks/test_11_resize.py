"""notebooks/11-resize.ipynb trains the digits across 2 → 3 → 2 engines (issue 29): the new
engine holds replica 0's parameters, every example of the epoch is trained on once, and the
status shows the size history."""

import re

import pytest

from nbdist.testing.kernels import cell_text, find_cell


@pytest.mark.timeout(600)
def test_resize_notebook(execute_notebook):
    nb = execute_notebook("11-resize")

    grown = cell_text(find_cell(nb, "%dist scale 3"))
    assert (
        "Scaled 2 → 3 engine(s)" in grown
        and "it: iterator, continues after global batch 8" in grown
    )
    assert "not copied" in grown and "helpers defined" in grown
    same = cell_text(find_cell(nb, "flat = torch.cat"))
    sums = re.findall(r"\(3, (-?[\d.e+-]+), \d+\)", same)
    assert len(sums) == 3 and len(set(sums)) == 1, same
    shrunk = cell_text(find_cell(nb, "%dist scale 2"))
    assert "Scaled 3 → 2 engine(s)" in shrunk
    done = cell_text(find_cell(nb, "while train(100)"))
    assert "examples trained on (all replicas): 1437" in done, done
    assert float(re.search(r"accuracy ([\d.]+)", done).group(1)) > 0.85
    status = cell_text(find_cell(nb, "%dist status"))
    assert "size history" in status and "2 → 3" in status and "3 → 2" in status
