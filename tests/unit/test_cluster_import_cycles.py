"""No import cycles inside `nbdist.cluster`: its modules (and the modules of each of its
subpackages, such as `engine_side`) import one another in one direction only.

A cycle makes the import order matter (a module can find the other half-initialised), and
hides which side depends on which: the notebook side (`engines`, `calls`, `remote`) imports
the engine side (`engine_side`), never the reverse. Imports inside functions count (they run
too); imports under `if TYPE_CHECKING:` do not (they never run). A subpackage counts as one
module at its parent's level, so `engine_side` importing `feed` while `feed` imports
`engine_side.publisher` is a cycle too.

Uses grimp (import-linter's graph builder), which reads the sources without importing them.
"""

from __future__ import annotations

import pathlib

import grimp
import pytest

import nbdist

ROOT = "nbdist.cluster"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    source = pathlib.Path(nbdist.__file__).resolve().parent
    assert source.parent == pathlib.Path(__file__).resolve().parents[2], (
        "nbdist is imported from another checkout; run with PYTHONPATH=<this checkout>"
    )
    return grimp.build_graph("nbdist", exclude_type_checking_imports=True, cache_dir=None)


def _packages(graph: grimp.ImportGraph) -> list[str]:
    """`nbdist.cluster` and each of its subpackages (the modules that have children)."""
    candidates = [ROOT, *sorted(graph.find_descendants(ROOT))]
    return [name for name in candidates if graph.find_children(name)]


def _cycles(graph: grimp.ImportGraph, package: str) -> list[str]:
    """One line per cycle among `package`'s children, e.g. `a -> b -> a`, with the line of each
    import that closes it."""
    lines = []
    for importer, imported in sorted(graph.nominate_cycle_breakers(package)):
        back = graph.find_shortest_chain(importer=imported, imported=importer) or ()
        details = graph.get_import_details(importer=importer, imported=imported)
        where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
        chain = " -> ".join([importer, *back]) if back else f"{importer} -> {imported}"
        lines.append(f"{chain}   (break it at {importer} -> {imported}: {where or 'a child'})")
    return lines


def test_engine_side_is_a_subpackage_of_the_cluster(graph):
    # the check below must see the engine side as a package of its own
    assert "nbdist.cluster.engine_side" in _packages(graph)


def test_no_module_of_nbdist_cluster_imports_itself_through_others(graph):
    found = {package: _cycles(graph, package) for package in _packages(graph)}
    found = {package: lines for package, lines in found.items() if lines}
    assert not found, "import cycles (runtime imports, TYPE_CHECKING ones excluded):\n" + "\n".join(
        f"  among the children of {package}:\n" + "\n".join(f"    {line}" for line in lines)
        for package, lines in found.items()
    )


def test_the_check_finds_a_cycle(graph):
    # the check is not vacuous: an import back from the engine side to the notebook side
    # (a cycle, since engines imports engine_side.joining) is reported, naming both modules
    back = {"importer": "nbdist.cluster.engine_side.joining", "imported": "nbdist.cluster.engines"}
    graph.add_import(
        **back, line_number=1, line_contents="from nbdist.cluster.engines import Cluster"
    )
    try:
        lines = _cycles(graph, ROOT)
    finally:
        graph.remove_import(**back)
    assert lines and any(
        "nbdist.cluster.engines" in line and "engine_side" in line for line in lines
    ), lines
    assert not _cycles(graph, ROOT)
