"""Every code example in README.md and docs/*.md runs as written.

- ```python blocks: all blocks of one file run in order in one fresh Python subprocess (they
  share one namespace, as a reader pasting them in order would), from the repository root.
- ```ipython blocks: all blocks of one file run in order as the cells of one notebook in a real
  kernel (nbclient), from the repository root.
- Other fences (bash, text, ...) are not run.

A failure names the file and the line where the failing block starts.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from nbdist.testing import no_leftover_processes
from nbdist.testing.kernels import run_cells

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
TIMEOUT_S = 300
_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", flags=re.S | re.M)


def blocks(path: pathlib.Path, language: str) -> list[tuple[int, str]]:
    """(line, source) of each fenced block of `language` in `path`, in order."""
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        if match.group(1) == language:
            line = text.count("\n", 0, match.start(2)) + 1
            found.append((line, match.group(2)))
    return found


_DRIVER = textwrap.dedent(
    """
    import json, sys
    blocks = json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    for line, source in blocks:
        print(f"=== block at line {line} ===", flush=True)
        code = compile("\\n" * (line - 1) + source, sys.argv[1], "exec")
        exec(code, namespace)
    print("=== all blocks ran ===", flush=True)
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["MPLBACKEND"] = "Agg"
    return env


def _ids(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def test_docs_are_found():
    assert ROOT / "README.md" in DOCS
    assert any(blocks(path, "python") for path in DOCS), "no ```python example in the docs"


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("path", DOCS, ids=_ids)
def test_python_blocks(path: pathlib.Path):
    found = blocks(path, "python")
    if not found:
        pytest.skip(f"{_ids(path)} has no ```python block")
    import json

    with no_leftover_processes(grace=30):
        result = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(path)],
            input=json.dumps(found),
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=_env(),
            timeout=TIMEOUT_S,
        )
    assert result.returncode == 0, (
        f"a ```python block of {_ids(path)} failed (exit {result.returncode}); the last "
        f"'=== block at line N ===' marks it.\n--- stdout ---\n{result.stdout[-6000:]}\n"
        f"--- stderr ---\n{result.stderr[-6000:]}"
    )
    assert "=== all blocks ran ===" in result.stdout


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("path", DOCS, ids=_ids)
def test_ipython_blocks(path: pathlib.Path):
    found = blocks(path, "ipython")
    if not found:
        pytest.skip(f"{_ids(path)} has no ```ipython block")
    with no_leftover_processes(grace=30):
        notebook = run_cells([source for _, source in found], timeout=TIMEOUT_S, cwd=ROOT)
    ran = [cell for cell in notebook.cells if cell.get("execution_count") is not None]
    assert len(ran) == len(found), f"{len(found) - len(ran)} block(s) of {_ids(path)} did not run"
