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


def test_notebook_runs_cells_on_the_engines(tmp_path, monkeypatch, extension, processes_gone):
    _kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    new = nbformat.v4
    notebook = new.new_notebook(
        cells=[
            new.new_code_cell(f"%load_ext {extension}"),
            new.new_code_cell("%dist start -n 2"),
            new.new_code_cell(
                "from nbdist.magics import current_cluster\n"
                "print('PIDS', *current_cluster().processes)"
            ),
            new.new_code_cell(
                "%%distribute\nimport os\nrank = int(os.environ['RANK'])\nprint('rank', rank)"
            ),
            new.new_code_cell("%%distribute\nrank * 10 + strategy.num_replicas_in_sync"),
            new.new_code_cell("%dist stop"),
        ]
    )
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": tmp_path}},
    )
    client.execute()
    start, pids, define, read, stop = (_text(cell) for cell in notebook.cells[1:])
    assert "alive" in start and "replica  engine" in start
    assert "[0] rank 0" in define and "[1] rank 1" in define
    assert "PerReplica:{0: 2, 1: 12}" in read
    assert "Cluster stopped" in stop
    engine_pids = [int(pid) for pid in re.search(r"PIDS (.*)", pids).group(1).split()]
    assert len(engine_pids) >= 3  # controller, engines, nannies
    processes_gone(engine_pids)
