"""Every module of nbdist is in a layer of the import-linter contract (pyproject.toml), and every
layer names a module that exists.

`lint-imports` checks only the modules a layer names: a module left out of every layer may
import anything (before issue 25, `metrics`, `holdings`, `timeline` and `testing` were, and
the contract passed while `metrics` imported the strategies). A layer in parentheses is
optional in import-linter (skipped when missing): none is allowed here, so a renamed module
fails this test instead of quietly dropping out of the contract.
"""

from __future__ import annotations

import pathlib
import re

import pytest

import nbdist

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI runs 3.11)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = pathlib.Path(nbdist.__file__).resolve().parent


def _layers_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    return layers


def _layer_modules(contract: dict) -> list[str]:
    """Every module a layer names, as a full dotted name (`core` -> `nbdist.core`)."""
    (container,) = contract["containers"]
    names = []
    for layer in contract["layers"]:
        for name in re.split(r"[:|]", layer):
            names.append(f"{container}.{name.strip()}")
    return names


def _modules() -> list[str]:
    """Every module of nbdist, from its files (a package by its `__init__.py`)."""
    names = []
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def _outside(modules: list[str], layers: list[str]) -> list[str]:
    return [
        module
        for module in modules
        if module != "nbdist"  # the facade: the container, re-exporting every layer
        and not any(module == layer or module.startswith(layer + ".") for layer in layers)
    ]


def test_no_layer_is_optional():
    contract = _layers_contract()
    assert not [layer for layer in contract["layers"] if "(" in layer], contract["layers"]


def test_every_layer_names_a_module_that_exists():
    modules = set(_modules())
    missing = [name for name in _layer_modules(_layers_contract()) if name not in modules]
    assert not missing, f"layers that name no module of nbdist: {missing}"


def test_every_module_of_nbdist_is_in_a_layer():
    outside = _outside(_modules(), _layer_modules(_layers_contract()))
    assert not outside, (
        f"modules of nbdist in no layer of pyproject's [tool.importlinter] contract: {outside}. "
        "Put each in the layer it belongs to (docs/architecture.md names them)."
    )


@pytest.mark.parametrize("module", ["nbdist.newthing", "nbdist.core.newthing"])
def test_the_check_finds_a_module_left_out(module):
    # not vacuous: a top-level module no layer names is reported; one inside a layer's
    # package is covered by that layer
    layers = _layer_modules(_layers_contract())
    found = _outside([*_modules(), module], layers)
    assert found == ([module] if module.count(".") == 1 else [])
