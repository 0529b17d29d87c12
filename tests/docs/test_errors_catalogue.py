"""docs/errors.md is the catalogue of every error nbdist raises (issue 12, item 7).

Every `NbdistError` subclass defined in nbdist has a `### Name` entry with its cause and fix,
and either a `python` example that raises it through the doc's `raises(Name, "text")` (run by
tests/docs/test_doc_examples.py, which checks the type and the message) or a `Produced by:`
test file that exists and mentions the error. An entry under "Defined but not raised" must
really be raised nowhere in nbdist.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
import re

import pytest

import nbdist
from nbdist.errors import NbdistError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
_SKIP = ("nbdist.app", "nbdist.__main__", "nbdist.cluster.launch._engine_main")


def _error_classes() -> dict[str, type]:
    """Every NbdistError subclass defined in an importable nbdist module, by name."""
    for module in pkgutil.walk_packages(nbdist.__path__, "nbdist."):
        if not module.name.startswith(_SKIP):
            importlib.import_module(module.name)
    found: dict[str, type] = {}
    pending = [NbdistError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("nbdist") and not cls.__module__.startswith(_SKIP):
            found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


def _entries() -> dict[str, str]:
    """The text of each `### Name` entry of docs/errors.md, by name."""
    text = DOC.read_text()
    parts = re.split(r"^### (\w+)\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


CLASSES = _error_classes()


def test_the_catalogue_is_complete():
    missing = sorted(set(CLASSES) - set(_entries()))
    assert not missing, f"docs/errors.md has no entry for {missing}"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_entry_says_cause_fix_and_how_it_is_produced(name):
    entry = _entries().get(name, "")
    cls = CLASSES[name]
    assert f"{cls.__module__}.{name}" in entry.replace("`", ""), "the entry names its module"
    defined_only = _section_of(name) == "Defined but not raised"
    if name == "NbdistError":
        return
    if defined_only:
        raised = [
            path
            for path in (ROOT / "nbdist").rglob("*.py")
            if re.search(rf"raise {name}\b", path.read_text())
        ]
        assert not raised, f"{name} is raised in {raised}: move its entry and give an example"
        return
    assert "**Cause:**" in entry and "**Fix:**" in entry
    example = re.search(rf"```python\n.*?raises\((?:[\w.]*\.)?{name},", entry, flags=re.S)
    produced = re.search(r"Produced by:\s*`([^`]+)`", entry)
    assert example or produced, f"{name}: give an example or the test that produces it"
    if not example:
        path = ROOT / produced.group(1)
        assert path.is_file(), f"{path} does not exist"
        assert name in path.read_text(), f"{path} does not mention {name}"


def _section_of(name: str) -> str:
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() == f"### {name}":
            return section
    return ""
