"""No import cycles anywhere in nbdist: its modules, and the children of each of its packages
(a subpackage counting as one node), import one another in one direction only.

A cycle makes the import order matter (a module can find another half-initialised), and hides
which side depends on which: the notebook side of the cluster imports the engine side, never
the reverse; the magics open the dashboard, the dashboard never imports the magics. Every
import counts: module-level ones, ones inside functions (they run too) and ones under
`if TYPE_CHECKING:` (a dependency all the same). The graph is read from the sources with `ast`
(tests/import_graph.py; `python tests/import_graph.py` prints it), nothing is imported.
"""

from __future__ import annotations

import copy
import pathlib

import pytest

import nbdist
from tests.import_graph import build_graph, import_lines, module_cycles, package_cycles

SOURCE = pathlib.Path(nbdist.__file__).resolve().parent


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, list[int]]]:
    assert SOURCE.parent == pathlib.Path(__file__).resolve().parents[2], (
        "nbdist is imported from another checkout; run with PYTHONPATH=<this checkout>"
    )
    return build_graph(SOURCE)


def _report(graph, groups) -> str:
    return "\n".join(
        "  {"
        + ", ".join(members)
        + "}\n"
        + "\n".join(f"    {line}" for line in import_lines(graph, members))
        for members in groups
    )


def test_the_graph_covers_every_module_and_every_kind_of_import(graph):
    assert len(graph) == len(list(SOURCE.rglob("*.py")))
    # a function-level import (remote refs resolved on the engine) is an edge
    assert "nbdist.cluster.refs" in graph["nbdist.cluster.engine_side.entry_points"]
    # so is one under TYPE_CHECKING (the engine-call path names its cluster by a protocol)
    assert "nbdist.cluster.handle" in graph["nbdist.cluster.engine_calls"]


def test_no_module_of_nbdist_imports_itself_through_others(graph):
    cycles = module_cycles(graph)
    assert not cycles, "import cycles among modules:\n" + _report(graph, cycles)


def test_no_package_of_nbdist_has_children_that_import_each_other_round_a_circle(graph):
    found = package_cycles(graph)
    assert not found, "import cycles among the children of a package:\n" + "\n".join(
        f"  in {package}:\n" + _report(graph, cycles) for package, cycles in found.items()
    )


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        # the engine side reaching back to the notebook's cluster
        ("nbdist.cluster.engine_side.entry_points", "nbdist.cluster.engines"),
        # the dashboard asking the magics for their cluster (the other old cycle)
        ("nbdist.widgets.dashboard", "nbdist.magics.core"),
    ],
)
def test_the_check_finds_a_cycle(graph, importer, imported):
    # the checks are not vacuous: putting back an import that closed a circle is reported,
    # naming both modules
    closed = copy.deepcopy(graph)
    closed[importer][imported] = [1]
    cycles = module_cycles(closed)
    assert any(importer in members and imported in members for members in cycles), cycles
    assert package_cycles(closed)
    assert any(f"{importer} -> {imported}" in line for line in import_lines(closed, cycles[0]))
