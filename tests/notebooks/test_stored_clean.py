"""The notebooks are stored without outputs, each opening with what it teaches, each tested."""

import pathlib

import nbformat
import pytest

from tests.notebooks.conftest import NOTEBOOKS

PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_notebooks_exist():
    names = {path.stem for path in PATHS}
    assert {"01-quickstart", "02-custom-training-loop", "03-in-process-strategies",
            "05-multi-host"} <= names  # fmt: skip


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_stored_without_outputs_and_with_a_purpose(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell was saved with its output"
            assert cell.execution_count is None, f"{path.name}: saved with execution counts"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "What this teaches" in first.source


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_every_notebook_has_a_test(path: pathlib.Path):
    number = path.stem.split("-")[0]
    tests = list(pathlib.Path(__file__).parent.glob(f"test_{number}_*.py"))
    assert tests, f"{path.name} has no tests/notebooks/test_{number}_*.py running it"
