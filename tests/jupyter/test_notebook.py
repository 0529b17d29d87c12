"""A real notebook, run by nbclient in a real kernel: `%load_ext nbdist` to `%dist stop`.

The kernel is this interpreter (`sys.executable` with its ipykernel), through a `python3`
kernelspec written under `tmp_path` and found first through `JUPYTER_PATH`.
"""

from __future__ import annotations

import json
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.cluster

TIMEOUT_S = 180


def _kernelspec(root) -> None:
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "nbdist test kernel", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))


def _text(cell) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "".join(parts)


LONG_CELL_TIMEOUT_S = 10  # the long cell runs 60 s unless interrupted; nbclient interrupts it

TRAINING_CELL = """%%distribute
with strategy.scope():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(rank)
x = torch.randn(8, 4)
y = x.sum(1, keepdim=True)

def step():
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()

for epoch in range(3):
    loss = strategy.reduce("mean", strategy.run(step), axis=None)
    print(f"epoch {epoch} loss {loss.item():.4f}")
round(float(model.weight.sum()), 6)
"""

PLOT_CELL = """%%distribute --output first
import matplotlib.pyplot as plt
plt.plot([0, 1], [rank, 1 - rank])
plt.title(f"replica {rank}");
"""

CELLS = {  # name -> source, in order
    "load": "%load_ext {extension}",
    "start": "%dist start -n 2",
    "pids": (
        "from nbdist.magics import current_cluster\nprint('PIDS', *current_cluster().processes)"
    ),
    "define": "%%distribute\nimport os\nrank = int(os.environ['RANK'])\nprint('rank', rank)",
    "read": "%%distribute\nrank * 10 + strategy.num_replicas_in_sync",
    "train": TRAINING_CELL,
    "plot": PLOT_CELL,
    "html": "%%distribute\nfrom IPython.display import HTML, display\n"
    "display(HTML(f'<b>hello from replica {rank}</b>'))",
    "auto_on": "%dist auto on",
    "auto_cell": "rank + 100",
    "auto_off": "%dist auto off",
    "local": "'rank' in globals()",
    "fail": "%%distribute\nif rank == 1:\n    raise ValueError('replica one fails')\nrank",
    "long": "%%distribute\nimport time\nfor _ in range(600):\n    time.sleep(0.1)",
    "after_interrupt": "%%distribute\nrank + 1",
    "restart": "%dist restart",
    "fresh": "%%distribute\n'rank' in globals()",
    "stop": "%dist stop",
}


def _outputs_of(cell, output_type):
    return [output for output in cell.outputs if output.output_type == output_type]


def test_notebook_runs_cells_on_the_engines(tmp_path, monkeypatch, extension, processes_gone):
    _kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    new = nbformat.v4
    sources = [source.replace("{extension}", extension) for source in CELLS.values()]
    notebook = new.new_notebook(cells=[new.new_code_cell(source) for source in sources])
    long_source = CELLS["long"]
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        timeout_func=lambda cell: LONG_CELL_TIMEOUT_S if cell.source == long_source else TIMEOUT_S,
        interrupt_on_timeout=True,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": tmp_path}},
    )
    client.execute()
    cells = dict(zip(CELLS, notebook.cells))
    text = {name: _text(cell) for name, cell in cells.items()}
    # Start, state kept between cells, output prefixed by replica, the value as a PerReplica.
    # (the whole start output on failure: engine and controller logs explain a slow start)
    assert "alive" in text["start"] and "replica  engine" in text["start"], text["start"]
    assert "2/2 engines registered" in text["start"]  # progress while starting
    assert "2 engines joined one torch.distributed group (gloo)" in text["start"]
    assert "[0] rank 0" in text["define"] and "[1] rank 1" in text["define"]
    assert "PerReplica:{0: 2, 1: 12}" in text["read"]
    # A training loop: both replicas print every epoch and end with the same weights.
    for rank in (0, 1):
        assert f"[{rank}] epoch 2 loss" in text["train"]
    weights = re.search(r"PerReplica:\{0: (\S+), 1: (\S+)\}", text["train"])
    assert weights and weights.group(1).rstrip(",") == weights.group(2)
    # Rich output: replica 0's figure as a PNG (--output first), both replicas' HTML.
    images = [o for o in _outputs_of(cells["plot"], "display_data") if "image/png" in o.data]
    assert len(images) == 1 and len(images[0].data["image/png"]) > 1000
    html = [o.data["text/html"] for o in _outputs_of(cells["html"], "display_data")]
    assert sorted(html) == [f"<b>hello from replica {r}</b>" for r in (0, 1)]
    # %dist auto: a plain cell runs on the engines; after `off`, here again.
    assert "PerReplica:{0: 100, 1: 101}" in text["auto_cell"]
    assert text["local"].strip() == "False"
    # A failing cell: one RemoteError naming replica 1; the next cells still run.
    errors = _outputs_of(cells["fail"], "error")
    assert len(errors) == 1 and errors[0].ename == "RemoteError"
    assert "replica(s) [1]" in errors[0].evalue and "replica one fails" in text["fail"]
    # The long cell was interrupted (by nbclient, as a user would), the engines stay usable.
    interrupted = _outputs_of(cells["long"], "error")
    assert [e.ename for e in interrupted] == ["ClusterInterrupted"]  # a KeyboardInterrupt
    assert "cluster is usable" in interrupted[0].evalue
    assert "PerReplica:{0: 1, 1: 2}" in text["after_interrupt"]
    # Restart: fresh engines, without the old state.
    assert "alive" in text["restart"]
    assert "PerReplica:{0: False, 1: False}" in text["fresh"]
    assert "Cluster stopped" in text["stop"]
    engine_pids = [int(pid) for pid in re.search(r"PIDS (.*)", text["pids"]).group(1).split()]
    assert len(engine_pids) >= 3  # controller, engines, nannies
    processes_gone(engine_pids)
