"""Notes: the long comments in nbdist/ that explain why the code is as it is (`Note [Title]:
...` opening a docstring line or a comment) and are referred to from nbdist, the tests, the
docs and the benchmarks (`Note [Title]`, `see Note [Title]`, `Note [Title] in nbdist.module`;
a test's docstring opening with `Note [Title]: ...` refers to the Note it checks). Each
referenced Note is defined exactly once, so a reference always leads to one explanation.
Notes state invariants; the measurements behind them live in benchmarks/results/recorded/ (one
JSON file per Note, with the date and the machine).
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("nbdist", "tests", "docs", "benchmarks")
# A definition opens a docstring line or a comment line: `Note [Title]: text` (not `: see ...`,
# which points at the definition elsewhere). A title may wrap onto the next comment line.
DEFINITION = re.compile(r"^[ \t]*(?:#[ \t]*|r?\"\"\")?Note \[([^\]]+)\]:(?![ \t]*see\b)", re.M)
REFERENCE = re.compile(r"Note\s+\[([^\]]+)\]")
RECORDED = re.compile(r"benchmarks/results/recorded/[\w.-]+\.json")
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
CHANGELOG = re.compile(r"\d\.\d+x,?\s*(?:->|→)")  # "1.36x -> 1.14x": a measurement's history


def _title(text: str) -> str:
    return re.sub(r"[\s#]+", " ", text).strip()


def _sources() -> list[tuple[str, str]]:
    files = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md") and ".venv" not in path.parts:
                files.append((path.relative_to(ROOT).as_posix(), path.read_text()))
    return files


def notes(sources: list[tuple[str, str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(definitions, references): where each Note title is defined (in nbdist/) and referred to
    (anywhere but this file)."""
    defined: dict[str, list[str]] = collections.defaultdict(list)
    referred: dict[str, list[str]] = collections.defaultdict(list)
    for name, text in sources:
        if name == THIS:
            continue
        for match in DEFINITION.finditer(text) if name.startswith("nbdist/") else ():
            line = text.count("\n", 0, match.start()) + 1
            defined[_title(match.group(1))].append(f"{name}:{line}")
        for match in REFERENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            referred[_title(match.group(1))].append(f"{name}:{line}")
    return defined, referred


def test_every_referenced_note_is_defined_exactly_once():
    defined, referred = notes(_sources())
    problems = [
        f"Note [{title}]: defined {len(defined[title])} times {defined[title]}, referred to at "
        f"{places[:3]}"
        for title, places in sorted(referred.items())
        if len(defined[title]) != 1
    ]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_missing_and_a_repeated_note():
    sources = [
        ("nbdist/a.py", "# Note [Kept]: why.\nx = 1  # Note [Kept]\n# see Note [Gone]\n"),
        ("nbdist/b.py", '"""Note [Twice]: one.\n\nNote [Twice]: two.\nNote [Kept]: see a\n"""'),
        ("tests/c.py", '    """Note [Kept]: the test of it."""'),
    ]
    defined, referred = notes(sources)
    assert defined == {"Kept": ["nbdist/a.py:1"], "Twice": ["nbdist/b.py:1", "nbdist/b.py:3"]}
    assert sorted(referred) == ["Gone", "Kept", "Twice"] and len(referred["Kept"]) == 4


def test_notes_point_at_recorded_measurements_that_exist_and_say_when_and_where():
    pointed = {
        match.group(0)
        for name, text in _sources()
        if name.startswith("nbdist/")
        for match in RECORDED.finditer(text)
    }
    assert pointed, "the performance Notes point at their measurements"
    for relative in sorted(pointed):
        record = json.loads((ROOT / relative).read_text())
        assert {"note", "date", "machine", "benchmark", "measurements"} <= set(record), relative


def test_no_note_keeps_a_measurements_history():
    found = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}"
        for name, text in _sources()
        if name.startswith("nbdist/")
        for match in CHANGELOG.finditer(text)
    ]
    assert not found, f"move the numbers to benchmarks/results/recorded/: {found}"
