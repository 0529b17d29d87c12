"""A notebook that exits without `cluster.stop()` leaves no process behind (atexit cleanup)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import psutil
import pytest

from nbdist.testing import assert_processes_gone

pytestmark = pytest.mark.cluster

SCRIPT = """
import json
from nbdist.cluster import Cluster

cluster = Cluster(n=1, timeout=90.0).start()
print(json.dumps(cluster.processes), flush=True)
# No cluster.stop(): the interpreter exits with the engine still running.
"""


def _pids(output: str | bytes | None) -> list[int]:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    for line in reversed((output or "").splitlines()):
        with contextlib.suppress(ValueError):
            pids = json.loads(line)
            if isinstance(pids, list):
                return pids
    return []


def test_exiting_without_stop_stops_the_cluster(tmp_path):
    env = {**os.environ, "IPYTHONDIR": str(tmp_path)}
    pids: list[int] = []
    try:
        try:
            result = subprocess.run(
                [sys.executable, "-c", SCRIPT],
                env=env, capture_output=True, text=True, timeout=150, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as expired:
            pids = _pids(expired.stdout)
            pytest.fail(f"the script did not finish: {expired.stderr!r}")
        pids = _pids(result.stdout)
        assert result.returncode == 0, result.stderr
        assert len(pids) >= 4, result.stdout  # controller (+ schedulers), engine, nanny
        assert_processes_gone(tuple(pids))
    finally:
        for pid in pids:  # never leave anything behind, even when the test fails
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
