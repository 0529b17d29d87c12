"""notebooks/12-sharded.ipynb: `%dist start --strategy fully_sharded`, a 4-block MLP trained
sharded over 2 engines in a `%%distribute` cell (each engine holding half of each weight),
gathered whole, its shards brought back, saved and restored with nd.checkpoint."""

import re

import pytest

from nbdist.testing.kernels import cell_text, find_cell

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_sharded(execute_notebook):
    nb = execute_notebook("12-sharded")

    trained = cell_text(find_cell(nb, "losses = [float(strategy.run(step"))
    for rank in (0, 1):
        assert f"[{rank}] rank {rank}: FullyShardedStrategy" in trained, trained
        assert f"rank {rank}: holds 32 of the 64 rows of each block's weight" in trained
    assert all(float(a) >= 0.8 for a in re.findall(r"held-out accuracy ([0-9.]+)", trained))
    for start, end in re.findall(r"loss ([0-9.]+) -> ([0-9.]+)", trained):
        assert float(end) < float(start) / 2
    shards = cell_text(find_cell(nb, "cluster.strategy.run(lambda: model"))
    assert "shards: [(32, 64), (32, 64)]" in shards
    assert "the shards stacked are the whole weight: True" in shards
    assert "every engine gathered the same: True" in shards
    restored = cell_text(find_cell(nb, "nd.checkpoint.restore(CHECKPOINT"))
    assert "rank 0: restored True" in restored and "rank 1: restored True" in restored
    assert "'.metadata'" in cell_text(find_cell(nb, "os.listdir(CHECKPOINT)"))
    assert "no engine is left" in cell_text(find_cell(nb, "%dist stop"))
