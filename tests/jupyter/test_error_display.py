"""What a notebook shows for errors (issue 12, item 6), in a real kernel run by nbclient.

One notebook starts 2 engines and runs: a `%%distribute` cell that fails the same way on both
replicas, one that fails differently on each, a `cluster.strategy.run` whose function fails,
a client-side bad argument, and `%dist stop`. Each rendered traceback (what Jupyter shows)
must hold the remote traceback(s) grouped by error with the replicas that share it, and no
frame of nbdist's own modules (magics/core.py, _cell.py, calls.py, ...).
"""

from __future__ import annotations

import json
import os
import re

import pytest

import nbdist
from nbdist.testing.kernels import run_cells
from tests.jupyter.conftest import EXTENSION

pytestmark = pytest.mark.cluster

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NBDIST_DIR = os.path.dirname(os.path.abspath(nbdist.__file__))
INTERNAL_NAMES = ("magics/core.py", "_cell.py", "calls.py", "engines.py", "engine_side")

CELLS = [
    f"%load_ext {EXTENSION}\n%dist start -n 2",
    "%%distribute\nx = 1 / 0",
    "%%distribute\nimport torch.distributed as dist\n"
    "if dist.get_rank() == 0:\n    raise KeyError('only on zero')\nelse:\n    int('one')",
    "def step():\n    return [][3]\n\ncluster.strategy.run(step)",
    "cluster.strategy.run(step, args=(1,), kwargs=None, options={'nope': 1})",
    "%dist stop",
    # the file %dist stop names (the kernel's IPYTHONDIR is removed with it): mode and sections
    "import glob, json, os\n"
    "for _path in glob.glob(os.path.join(os.environ['IPYTHONDIR'], '*', 'log', 'nbdist-*.log')):\n"
    "    print(json.dumps([_path, os.stat(_path).st_mode & 0o777, open(_path).read()]))",
]


def _shown(cell) -> tuple[str, str | None]:
    """The cell's rendered error (ANSI codes removed) and its ename, or ('', None)."""
    for output in cell.outputs:
        if output.get("output_type") == "error":
            return _ANSI.sub("", "\n".join(output["traceback"])), output["ename"]
    return "", None


def _assert_no_internal_frame(text: str) -> None:
    assert NBDIST_DIR not in text, text
    for name in INTERNAL_NAMES:
        assert name not in text, text


@pytest.fixture(scope="module")
def notebook():
    return run_cells(CELLS, allow_errors=True, timeout=180)


def test_a_failing_cell_shows_one_remote_traceback_for_both_replicas(notebook):
    text, ename = _shown(notebook.cells[1])
    assert ename == "RemoteError"
    _assert_no_internal_frame(text)
    assert "[replicas 0, 1] ZeroDivisionError: division by zero" in text
    assert text.count("x = 1 / 0") == 1  # one traceback for the two replicas
    assert text.splitlines()[0].startswith("RemoteError: 2 of 2 replica(s) failed")


def test_distinct_errors_are_shown_apart_with_their_replica(notebook):
    text, ename = _shown(notebook.cells[2])
    assert ename == "RemoteError"
    _assert_no_internal_frame(text)
    assert "[replica 0] KeyError: 'only on zero'" in text
    assert "[replica 1] ValueError: invalid literal for int()" in text


def test_strategy_run_shows_the_users_frame_only(notebook):
    text, ename = _shown(notebook.cells[3])
    assert ename == "RemoteError"
    _assert_no_internal_frame(text)
    assert "[replicas 0, 1] IndexError: list index out of range" in text
    assert "return [][3]" in text


def test_a_client_side_error_hides_nbdist_frames(notebook):
    text, ename = _shown(notebook.cells[4])
    assert ename is not None and ename != "RemoteError"
    _assert_no_internal_frame(text)
    assert "cluster.strategy.run(step" in text  # the user's own line stays


def test_dist_stop_prints_one_line_and_engines_exit_0(notebook):
    cell = notebook.cells[5]
    _, ename = _shown(cell)
    assert ename is None
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    print(text)
    # A normal stop: no engine log, no "Event loop stopped before Future completed", exit 0
    # (ipyparallel shows the engines' logs only when one exits with another status).
    assert "Event loop stopped" not in text and "'exit_code': 1" not in text
    # Also when a process too slow to stop in 5 s (a loaded machine) is killed: a stop the
    # user asked for prints no process's log.
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Cluster stopped: no engine is left.")
    # ... naming the file that keeps what the engines and the controller printed (owner only)
    logs = lines[0].partition(" Engine logs: ")[2]
    assert logs.endswith(".log"), lines[0]
    listed = "".join(o.get("text", "") for o in notebook.cells[6].outputs)
    found = {path: (mode, content) for path, mode, content in map(json.loads, listed.splitlines())}
    mode, content = found[logs]
    assert mode == 0o600
    assert "===== controller =====" in content and "===== engines" in content
