"""No orphans: when the process that started a cluster dies, however it dies, every process
of the cluster (engines, their nannies, the controller and its schedulers) stops.

Each case starts `nd.Cluster(n=2)` in a child Python, reads the pids of every process the
cluster started, kills the child with a signal that runs none of its exit handlers, and waits
(bounded) until each of those pids is gone. The kernel-restart case is in
tests/jupyter/test_kernel.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from nbdist.testing import assert_processes_gone

pytestmark = pytest.mark.cluster

GONE_WITHIN_S = 20.0

SCRIPT = """
import json, sys
from nbdist.cluster import Cluster

cluster = Cluster(n=2, timeout=90.0).start()
print(json.dumps(cluster.processes), flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=["SIGKILL", "SIGTERM", "SIGHUP"]
)
def test_the_cluster_stops_when_its_starter_dies(sig, tmp_path):
    env = {**os.environ, "IPYTHONDIR": str(tmp_path)}
    starter = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        line = starter.stdout.readline()  # bounded: the cluster's own start timeout (90 s)
        pids = json.loads(line) if line.strip() else []
        assert len(pids) >= 6, f"the cluster did not start: {line!r}"
        starter.send_signal(sig)
        starter.wait(timeout=30)
        begin = time.monotonic()
        assert_processes_gone(tuple(pids), GONE_WITHIN_S)
        print(f"\n{signal.Signals(sig).name}: all {len(pids)} processes gone after "
              f"{time.monotonic() - begin:.1f} s")  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            starter.kill()
            starter.wait(timeout=10)
        for pid in pids:  # never leave anything behind, even when the test fails
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


WATCHER = """
import sys, time
from nbdist.cluster.launch.parent_watch import watch_parent
watch_parent(poll_s=0.05)
print(sys.argv[1:], flush=True)  # the flag is gone: ipyparallel never sees it
sys.stdin.read()  # until stopped, or until the test closes stdin
"""


def _dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait(timeout=30)
    return finished.pid


@pytest.mark.parametrize("parent", ["dead", "alive"])
def test_a_process_whose_starter_died_before_it_looked_stops_at_once(parent):
    """Ctrl-C while the cluster starts: the controller may begin after its starter has gone
    (re-parented to init, so `getppid()` alone would watch init forever); `--nbdist-parent`
    names the starter, and the process stops at once."""
    pid = _dead_pid() if parent == "dead" else os.getpid()
    child = subprocess.Popen(
        [sys.executable, "-c", WATCHER, f"--nbdist-parent={pid}", "--other"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "['--other']"
        if parent == "dead":
            assert child.wait(timeout=GONE_WITHIN_S) in (-signal.SIGTERM, 75)
        else:
            with pytest.raises(subprocess.TimeoutExpired):  # still watching its live parent
                child.wait(timeout=1.0)
            child.stdin.close()
            assert child.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(Exception):
            child.kill()
            child.wait(timeout=10)
