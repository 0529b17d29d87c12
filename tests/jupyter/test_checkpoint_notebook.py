"""nd.checkpoint in `%%distribute` cells of a real notebook (nbclient, a real kernel).

A run saved on 2 engines is resumed after `%dist stop` / `%dist start -n 3` and ends at the
parameters of the uninterrupted 2-engine run (within 1e-6); a checkpoint of another model is
one RemoteError naming the problem on every replica, and the engines stay usable.
"""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from nbclient import NotebookClient

from tests.jupyter.test_notebook import TIMEOUT_S, _kernelspec, _outputs_of, _text

pytestmark = pytest.mark.cluster

SETUP = """%%distribute
import json
from torch.utils.data import DataLoader, TensorDataset
data = torch.Generator().manual_seed(0)
x = torch.randn(96, 5, generator=data)
y = x @ torch.randn(5, 2, generator=data)
loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True,
                    generator=torch.Generator().manual_seed(7))
torch.manual_seed(1)
with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
iterator = iter(strategy.experimental_distribute_dataset(loader))

def step(batch):
    inputs, targets = batch
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

def train(steps):
    for _ in range(steps):
        strategy.run(step, args=(next(iterator),))

def show(tag):
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(tag, json.dumps(params.tolist()))
"""

CELLS = {
    "load": "%load_ext {extension}",
    "start": "%dist start -n 2",
    "setup_full": SETUP,
    "full": "%%distribute\ntrain(8)\nshow('FULL')",
    "setup_first": SETUP,
    "first": "%%distribute\ntrain(3)\nnd.checkpoint.save({path!r}, model=model, "
    "optimizer=optimizer, iterator=iterator)",
    "stop": "%dist stop",
    "start3": "%dist start -n 3",
    "setup_resumed": SETUP,
    "resumed": "%%distribute\nnd.checkpoint.restore({path!r}, model=model, optimizer=optimizer, "
    "iterator=iterator)\ntrain(5)\nshow('RESUMED')\nsum(1 for _ in iterator)",
    "other_model": "%%distribute\nnd.checkpoint.restore({path!r}, model=torch.nn.Linear(5, 3))",
    "after": "%%distribute\n1 + 1",
    "stop3": "%dist stop",
}


def _params(text: str, tag: str) -> dict[int, list[float]]:
    found = re.findall(rf"\[(\d+)\] {tag} (\[.*?\])\n", text)
    return {int(replica): json.loads(values) for replica, values in found}


def test_checkpoint_in_distribute_cells_resumes_on_three_engines(tmp_path, monkeypatch, extension):
    _kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    path = str(tmp_path / "run.pt")
    sources = [
        source.replace("{extension}", extension).replace("{path!r}", repr(path))
        for source in CELLS.values()
    ]
    new = nbformat.v4
    notebook = new.new_notebook(cells=[new.new_code_cell(source) for source in sources])
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": tmp_path}},
    )
    client.execute()
    cells = dict(zip(CELLS, notebook.cells))
    text = {name: _text(cell) for name, cell in cells.items()}
    for name in ("setup_full", "full", "setup_first", "first", "setup_resumed", "resumed"):
        assert not _outputs_of(cells[name], "error"), (name, text[name])
    full, resumed = _params(text["full"], "FULL"), _params(text["resumed"], "RESUMED")
    assert sorted(full) == [0, 1], text["full"]
    assert sorted(resumed) == [0, 1, 2], text["resumed"]
    for values in resumed.values():
        gap = max(abs(a - b) for a, b in zip(values, full[0]))
        assert gap < 1e-6, gap
    assert "PerReplica:{0: 0, 1: 0, 2: 0}" in text["resumed"]  # the epoch ended where it should
    errors = _outputs_of(cells["other_model"], "error")
    assert len(errors) == 1 and errors[0].ename == "RemoteError"
    assert "replica(s) [0, 1, 2]" in errors[0].evalue
    assert "CheckpointMismatchError" in text["other_model"]
    assert "holds parameters for a model with" in text["other_model"]
    assert "PerReplica:{0: 2, 1: 2, 2: 2}" in text["after"]
    assert "Cluster stopped" in text["stop3"]
    print(text["other_model"])
