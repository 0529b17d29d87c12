"""A failure inside a collective shows its cause first (issue 24, items 2 and 7), in a real
kernel run by nbclient with 2 real engines.

Replica 1 raises `ZeroDivisionError` while replica 0 waits for it in an all-reduce: the
notebook shows replica 1's error with its own frames, named as the editor names the cell
(`Cell In[2], line 6`), then one line for replica 0 ("released from all_reduce:SUM #1
because replica 1 failed"): under 15 lines, no frame or message of nbdist, torch or gloo.
`%dist traceback` prints everything left out. A checkpoint that does not fit prints its
message once, without nbdist's frames; `%dist status` stops naming a repair once a later
cell succeeded.
"""

from __future__ import annotations

import os
import re

import pytest

import nbdist
from nbdist.testing.kernels import run_cells
from tests.jupyter.conftest import EXTENSION

pytestmark = pytest.mark.cluster

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NBDIST_DIR = os.path.dirname(os.path.abspath(nbdist.__file__))
INTERNAL = (
    NBDIST_DIR,
    f"{os.sep}torch{os.sep}",
    "nbdist/collectives/",
    "save_restore.py",
    "GLHF",
    "Connection closed",
    "gloo",
    "WorkerLostError",
    "ipyparallel",
    "distribute-cell",
)

CELLS = [
    f"%load_ext {EXTENSION}\n%dist start -n 2",
    # In[2]: replica 1 raises at line 6 while replica 0 waits in nbdist's all-reduce
    "%%distribute\n"
    "def step():\n"
    "    ctx = nd.get_replica_context()\n"
    "    if ctx.replica_id_in_sync_group == 1:\n"
    "        return 1 / 0\n"
    "    return ctx.all_reduce('sum', torch.ones(1))\n"
    "strategy.run(step)",
    # In[3]: the same through cluster.strategy.run, the function defined here
    "def step():\n"
    "    ctx = nd.get_replica_context()\n"
    "    if ctx.replica_id_in_sync_group == 1:\n"
    "        return 1 / 0\n"
    "    return ctx.all_reduce('sum', torch.ones(1))\n"
    "\n"
    "import torch, nbdist as nd\n"
    "cluster.strategy.run(step)",
    "%dist status",
    "%%distribute\n1 + 1",
    "%dist status",
    "%dist traceback",
    # In[8]: a checkpoint of another model, restored at line 4
    "%%distribute\n"
    "import os, tempfile\n"
    "path = os.path.join(tempfile.gettempdir(), f'nbdist-cause-first-{os.getppid()}.pt')\n"
    "nd.checkpoint.save(path, model=torch.nn.Linear(2, 1))\n"
    "nd.checkpoint.restore(path, model=torch.nn.Linear(3, 1))",
    "%dist auto on",
    # In[10]: with `%dist auto on` the cell has no %%distribute line: its line 3 is line 3
    "import os\nif os.environ['RANK'] == '1':\n    raise ValueError('auto')",
    "%dist auto off",
    "%dist stop",
]


def _error(cell) -> tuple[str, str | None]:
    for output in cell.outputs:
        if output.get("output_type") == "error":
            return _ANSI.sub("", "\n".join(output["traceback"])), output["ename"]
    return "", None


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


@pytest.fixture(scope="module")
def notebook():
    return run_cells(CELLS, allow_errors=True, timeout=180)


def _assert_cause_first(text: str, cell_line: str, source: str) -> None:
    print(text)
    lines = text.splitlines()
    assert len(lines) < 15, len(lines)
    # The header names the replica that raised and its error; replica 0 did not "fail".
    assert lines[0].startswith("RemoteError: 1 of 2 replica(s) failed in ") and lines[0].endswith(
        "replica(s) [1] raised ZeroDivisionError."
    ), lines[0]
    # The cause, with the user's frame as the editor names it, before the consequence.
    cause = lines.index("[replica 1] ZeroDivisionError: division by zero")
    released = [i for i, line in enumerate(lines) if line.startswith("replica 0: released")]
    assert len(released) == 1 and cause < released[0], text
    assert re.fullmatch(
        r"replica 0: released from all_reduce:SUM #\d+ because replica 1 failed", lines[released[0]]
    ), lines[released[0]]
    assert f"  {cell_line}" in lines and f"    {source}" in lines, text
    for internal in INTERNAL:
        assert internal not in text, internal
    assert "`%dist traceback`" in lines[-1]


def test_a_distribute_cell_shows_the_cause_first(notebook):
    text, ename = _error(notebook.cells[1])
    assert ename == "RemoteError"
    _assert_cause_first(text, "Cell In[2], line 5, in step", "return 1 / 0")


def test_strategy_run_shows_the_cause_first(notebook):
    text, ename = _error(notebook.cells[2])
    assert ename == "RemoteError"
    _assert_cause_first(text, "Cell In[3], line 4, in step", "return 1 / 0")
    assert "formed again" in text  # the cluster's state stays


def test_dist_status_forgets_the_repair_once_a_cell_succeeds(notebook):
    assert "formed again after: replica 1 failed" in _stdout(notebook.cells[3])
    assert "PerReplica:{0: 2, 1: 2}" in str(notebook.cells[4].outputs)
    after = _stdout(notebook.cells[5])
    assert "running" in after and "formed again" not in after, after


def test_dist_traceback_prints_every_frame(notebook):
    text = _stdout(notebook.cells[6])
    # the last error's (cell In[3]) full tracebacks: replica 0's chained gloo error and
    # nbdist's frames, replica 1's error
    assert "--- replica 0 (engine 0" in text and "(a consequence)" in text
    assert "nbdist/collectives/" in text and "WorkerLostError" in text
    assert "--- replica 1 (engine 1" in text
    assert "ZeroDivisionError: [replica 1 of 2] division by zero" in text


def test_a_checkpoint_mismatch_prints_its_message_once(notebook):
    text, ename = _error(notebook.cells[7])
    print(text)
    assert ename == "RemoteError"
    assert text.count("holds parameters for a model with") == 1, text
    assert "[replicas 0, 1] CheckpointMismatchError: Checkpoint" in text
    assert "  Cell In[8], line 5, in <module>" in text.splitlines()
    for internal in ("save_restore.py", "with_traceback", NBDIST_DIR):
        assert internal not in text, internal
    assert len(text.splitlines()) <= 6


def test_a_cell_run_by_dist_auto_keeps_its_line_numbers(notebook):
    text, ename = _error(notebook.cells[9])
    assert ename == "RemoteError"
    lines = text.splitlines()
    assert "  Cell In[10], line 3, in <module>" in lines, text
    assert lines[-2] == "[replica 1] ValueError: auto", text
