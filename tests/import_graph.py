"""nbdist's import graph, read from the sources with `ast` (nothing is imported), and its cycles.

Every import counts: module-level ones, ones inside functions (they run too, later) and ones
under `if TYPE_CHECKING:` (they state a dependency even if they never run, and a cycle through
them is one refactor away from a real one). A cycle makes the import order matter (a module
can find another half-initialised) and hides which side depends on which.

Two views:
- `module_cycles`: modules that reach themselves through others (strongly connected
  components of the module graph, each of two or more modules).
- `package_cycles`: for each package, its children (a subpackage counts as one node) that
  reach themselves through others, e.g. `strategies -> collectives -> strategies`.

Run it as a script to print both: `python tests/import_graph.py [path/to/nbdist]`.

Example:
    >>> import pathlib
    >>> graph = build_graph(pathlib.Path(__file__).resolve().parents[1] / "nbdist")
    >>> "nbdist.errors" in graph
    True
"""

from __future__ import annotations

import ast
import pathlib
import sys

__all__ = ["build_graph", "import_lines", "module_cycles", "package_cycles"]

Graph = dict[str, dict[str, list[int]]]  # importer -> imported -> line numbers


def _module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of the package at `root` (a folder with `__init__.py`), by dotted name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """`name`, or the nearest enclosing module that exists (`a.b.Class` -> `a.b`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def build_graph(root: pathlib.Path) -> Graph:
    """The import graph of the package at `root`, internal edges only, with line numbers."""
    root = pathlib.Path(root)
    top = root.name
    modules = _module_names(root)
    graph: Graph = {name: {} for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    if node.level > 1:
                        base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the module pkg.sub when there is one
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    targets.append(child if child in modules else source)
            for target in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                found = _resolve(target, modules)
                if found is None or found == name:
                    continue
                graph[name].setdefault(found, []).append(node.lineno)
    return graph


def _strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of two or more nodes, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def module_cycles(graph: Graph, top: str = "nbdist") -> list[list[str]]:
    """Groups of modules that import one another round a circle.

    The package `__init__` of `top` is left out: it is the facade that re-exports the public
    API of every layer, and nothing inside the package imports it.
    """
    edges = {
        importer: {imported for imported in targets if imported != top}
        for importer, targets in graph.items()
        if importer != top
    }
    return _strongly_connected(sorted(edges), edges)


def package_cycles(graph: Graph, top: str = "nbdist") -> dict[str, list[list[str]]]:
    """Per package: its children (subpackages as one node) that import one another round a circle.

    A package's `__init__` is not a child of itself here; its imports of its own children (the
    re-exports that make a package's public names) are not edges between children.
    """
    packages = {name for name in graph for other in graph if other.startswith(name + ".")}
    found = {}
    for package in sorted(packages):
        if package == top:
            pass

        def child(name: str, package: str = package) -> str | None:
            if not name.startswith(package + "."):
                return None
            return package + "." + name[len(package) + 1 :].split(".")[0]

        edges: dict[str, set[str]] = {}
        for importer, targets in graph.items():
            a = child(importer)
            if a is None:
                continue
            for imported in targets:
                b = child(imported)
                if b is not None and b != a:
                    edges.setdefault(a, set()).add(b)
        cycles = _strongly_connected(sorted(edges), edges)
        if cycles:
            found[package] = cycles
    return found


def import_lines(graph: Graph, members: list[str]) -> list[str]:
    """The imports among `members` (modules, or packages standing for their modules), one a line."""
    lines = []

    def within(name: str, member: str) -> bool:
        return name == member or name.startswith(member + ".")

    for a in members:
        for b in members:
            if a == b:
                continue
            for importer, targets in sorted(graph.items()):
                if not within(importer, a):
                    continue
                for imported, numbers in sorted(targets.items()):
                    if within(imported, b):
                        where = ", ".join(map(str, numbers))
                        lines.append(f"{importer} -> {imported} (line {where})")
    return lines


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[0]) if argv else pathlib.Path(__file__).resolve().parents[1] / "nbdist"
    graph = build_graph(root)
    modules = module_cycles(graph, root.name)
    packages = package_cycles(graph, root.name)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} internal import edges")
    print(f"module cycles: {len(modules)}")
    for members in modules:
        print("  {" + ", ".join(members) + "}")
        for line in import_lines(graph, members):
            print("      " + line)
    print(f"package-level cycles: {sum(map(len, packages.values()))}")
    for package, cycles in packages.items():
        for members in cycles:
            print(f"  in {package}: {{" + ", ".join(members) + "}")
            for line in import_lines(graph, members):
                print("      " + line)
    return 1 if modules or packages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
