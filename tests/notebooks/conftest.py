"""Fixtures for the example notebooks under notebooks/: each is run end to end in a real kernel.

`execute_notebook("01-quickstart")` runs notebooks/01-quickstart.ipynb with nbclient (through
`nbdist.testing.kernels.run_notebook`, kernel started in the notebooks folder, so files it
writes land in a temporary copy of that folder) and checks that neither the kernel nor any
engine it started is left running, and that no cell printed a Python warning or HTML-looking
text (`stream_warts`: what a reader should never see). Tests then assert the notebook's key
results on the returned, executed notebook (`find_cell`, `cell_text`).
"""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Callable

import pytest

from nbdist.testing import no_leftover_processes
from nbdist.testing.kernels import run_notebook, stream_warts

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 240


@pytest.fixture
def execute_notebook(tmp_path: pathlib.Path) -> Callable[..., object]:
    """Run notebooks/<name>.ipynb in a real kernel, in a copy of the folder; return it executed."""

    def execute(name: str, timeout: float = CELL_TIMEOUT_S) -> object:
        source = NOTEBOOKS / f"{name}.ipynb"
        assert source.exists(), f"{source} is missing"
        copy = tmp_path / "notebooks"
        shutil.copytree(NOTEBOOKS, copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        with no_leftover_processes(grace=30):
            notebook = run_notebook(copy / source.name, timeout=timeout)
        warts = stream_warts(notebook)
        assert not warts, f"{name} printed warnings or raw HTML:\n" + "\n".join(warts)
        return notebook

    return execute
