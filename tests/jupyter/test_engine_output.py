"""What engines show in a real kernel's cells (issue 24, items 1 and 3), via jupyter_client.

One kernel (this interpreter's ipykernel, as JupyterLab starts it) with `%load_ext nbdist` and
`%dist start -n 2` serves the module.

- `nd.progress` in a `%%distribute` cell is drawn as tqdm's widget (the messages JupyterLab
  renders: a FloatProgress model and its HTML labels): one bar per loop, with the loop's total,
  updated while the engines run, at 100 % at the end, with no text bar in any stream.
- An engine killed while the cluster runs: its process's own log (ipyparallel's engine debug
  lines) never reaches a cell; one line names the file that holds it.
"""

from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field

import pytest
from jupyter_client.manager import KernelManager

from nbdist.testing.kernels import cluster_kernel
from tests.jupyter.conftest import EXTENSION, start_kernel_manager

pytestmark = pytest.mark.cluster

CELL_TIMEOUT_S = 180.0
TOTAL = 40
STEP_S = 0.1


@dataclass
class Cell:
    """What one executed cell sent: its streams, widget models and when each update came."""

    streams: str = ""
    error: dict | None = None
    models: dict = field(default_factory=dict)  # comm id -> latest state
    updates: list = field(default_factory=list)  # (arrival time, comm id, state)
    done_at: float = 0.0


class Kernel:
    def __init__(self, km: KernelManager):
        self.km = km
        self.client = km.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=CELL_TIMEOUT_S)
        self.models: dict = {}  # every widget model the kernel opened, by comm id
        self.all_streams = ""  # every stream text, whichever cell it is attached to

    def run(self, code: str, timeout: float = CELL_TIMEOUT_S) -> Cell:
        msg_id = self.client.execute(code)
        cell = Cell()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no idle within {timeout} s; got {cell.streams!r}"
            try:
                msg = self.client.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":  # also output attached to an earlier cell, shown under it
                self.all_streams += content["text"]
            if kind == "comm_open":
                self.models[content["comm_id"]] = dict(content["data"].get("state", {}))
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                state = self.models.setdefault(content["comm_id"], {})
                state.update(content["data"].get("state", {}))
                if msg["parent_header"].get("msg_id") == msg_id:
                    cell.updates.append((time.monotonic(), content["comm_id"], dict(state)))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "comm_open":
                cell.models[content["comm_id"]] = self.models[content["comm_id"]]
            elif kind == "stream":
                cell.streams += content["text"]
            elif kind == "error":
                cell.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                cell.done_at = time.monotonic()
                return cell


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    km = start_kernel_manager(tmp_path_factory.mktemp("jupyter"))
    start = f"%load_ext {EXTENSION}\n%dist start -n 2"
    with cluster_kernel(km, start, Kernel, lambda cell: (cell.streams, cell.error)) as k:
        yield k


def _progress_models(cell: Cell) -> dict:
    return {
        comm: state
        for comm, state in cell.models.items()
        if state.get("_model_name") == "FloatProgressModel"
    }


def _labels(cell: Cell) -> str:
    return " | ".join(
        str(state.get("value", ""))
        for state in cell.models.values()
        if state.get("_model_name") == "HTMLModel"
    )


@pytest.mark.parametrize("output", ["all", "none"])
def test_progress_is_one_live_widget_reaching_100_percent(kernel, output):
    cell = kernel.run(
        f"%%distribute --output {output}\n"
        "import time\n"
        f"for batch in nd.progress(range({TOTAL}), desc='training'):\n"
        f"    time.sleep({STEP_S})\n"
        "    if batch == 20:\n"
        "        print('half way')\n"
        "print('trained')\n"
    )
    assert cell.error is None, cell.error
    bars = _progress_models(cell)
    assert len(bars) == 1, cell.models  # one bar for the cell, not one per replica
    (comm, bar), = bars.items()
    assert bar["max"] == TOTAL and bar["value"] == TOTAL, bar
    assert "training" in _labels(cell) and "100%" in _labels(cell), _labels(cell)
    assert f"{TOTAL}/{TOTAL}" in _labels(cell), _labels(cell)
    assert bar.get("bar_style") == "success", bar
    # live: a partial count arrived while the engines were still iterating (the loop runs
    # TOTAL * STEP_S = 4 s; a count drawn at least 1 s before the cell's end)
    partial = [t for t, c, s in cell.updates if c == comm and 0 < s.get("value", 0) < TOTAL]
    assert partial and partial[0] < cell.done_at - 1.0, (partial, cell.done_at)
    # no text bar anywhere in the cell's streams
    assert "%|" not in cell.streams and "it/s" not in cell.streams, cell.streams
    if output == "all":
        assert "[0] trained" in cell.streams and "[1] trained" in cell.streams
        assert "[0] half way" in cell.streams and "[1] half way" in cell.streams
    else:
        assert cell.streams == ""


def test_a_killed_engine_leaves_its_log_in_a_file_not_in_the_cell(kernel):
    """Last (it kills an engine): what the dying engine's process printed goes to the
    cluster's log file; the notebook shows one line naming it, and no engine debug line."""
    marker = kernel.run(
        "%%distribute\nimport os\nprint('user output before dying', os.getpid())"
    )
    assert "[1] user output before dying" in marker.streams
    victim = int(re.search(r"\[1\] user output before dying (\d+)", marker.streams).group(1))
    cell = kernel.run(
        "import os, signal, time\n"
        "from nbdist.magics import current_cluster\n"
        f"os.kill({victim}, signal.SIGKILL)\n"
        "deadline = time.monotonic() + 60\n"
        "while time.monotonic() < deadline and all(\n"
        "        row.state == 'alive' for row in current_cluster().status()):\n"
        "    time.sleep(0.2)\n"
        "print([row.state for row in current_cluster().status()])\n"
    )
    assert "dead" in cell.streams, cell.streams
    # ipyparallel reports the exit from the kernel's event loop: in this cell, a later one, or
    # between cells (then under the cell that ran last)
    kernel.all_streams = ""
    shown = cell.streams
    deadline = time.monotonic() + 30
    while "exited unexpectedly" not in shown and time.monotonic() < deadline:
        kernel.run("import time\ntime.sleep(0.5)")
        shown = cell.streams + kernel.all_streams
    assert "Handling apply_request" not in shown and "[Engine." not in shown, shown
    assert "Output for" not in shown, shown
    named = re.search(r"exited unexpectedly; what its process printed is in (\S+\.log)", shown)
    assert named, shown
    assert f"[nbdist] replica 1's engine (pid {victim}) exited unexpectedly" in shown, shown
    with open(named.group(1)) as file:
        kept = file.read()
    assert "exited at" in kept and len(kept.splitlines()) > 3, kept
