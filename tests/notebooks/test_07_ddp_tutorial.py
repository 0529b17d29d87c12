"""notebooks/07-ddp-tutorial.ipynb: PyTorch's DDP tutorial on 2 engines. The step in
`strategy.run` applies the one-device gradient over both engines' examples and keeps the
copies identical; the checkpoint demo restores without barrier or map_location; the literal
port (the step outside `strategy.run`) is averaged or refused naming `strategy.run`, never
trains the copies apart."""

import pytest

from nbdist.testing.kernels import cell_text, find_cell

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_ddp_tutorial(execute_notebook):
    nb = execute_notebook("07-ddp-tutorial")

    assert "2 engines joined one torch.distributed group" in cell_text(nb.cells[1])
    basic = cell_text(find_cell(nb, 'cluster.pull("initial", "gradients", "after")'))
    assert "gradients equal the one-device gradient over 40 examples: True" in basic
    assert "replicas identical after the step: True" in basic
    assert "[0] rank 0: restored True" in cell_text(find_cell(nb, "nd.checkpoint.restore"))
    checkpoint = cell_text(find_cell(nb, 'cluster.pull("restored", "weights")'))
    assert "restored on both engines: True" in checkpoint
    assert "replicas identical after another step: True" in checkpoint

    literal = cell_text(find_cell(nb, 'cluster.pull("outcome", "weights"'))
    assert "replicas identical after the literal step: True" in literal
    if "what the engines saw: the step ran" in literal:  # averaged, as inside strategy.run
        assert "gradients equal the one-device gradient over 40 examples: True" in literal
    else:  # refused, naming the fix
        assert "what the engines saw: refused:" in literal and "strategy.run" in literal
    assert "no engine is left" in cell_text(find_cell(nb, "%dist stop"))
