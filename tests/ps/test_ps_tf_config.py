"""examples/parameter_server_digits.py as four processes from `TF_CONFIG` (chief, 2 workers,
1 ps) on 127.0.0.1: the chief trains to at least 90 % test accuracy using both workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist.testing.ports import free_ports, wait_for_listener
from nbdist.testing.processes import worker_env

pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "parameter_server_digits.py"


def test_tf_config_scripts_train_the_digits_classifier():
    ports = free_ports(4)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
        "ps": [f"127.0.0.1:{ports[3]}"],
    }

    def env(job: str, index: int) -> dict[str, str]:
        config = {"cluster": cluster, "task": {"type": job, "index": index}}
        return worker_env({"TF_CONFIG": json.dumps(config), "PYTHONPATH": str(ROOT)})

    servers = []
    try:
        for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            servers.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPT)],
                    env=env(job, index),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        # Both workers must be serving before the chief starts: a worker that comes up late
        # (a loaded machine) would rightly get no work from a short run, as in TensorFlow.
        for port in ports[1:3]:
            wait_for_listener(port, timeout=120)
        chief = subprocess.run(
            [sys.executable, str(SCRIPT), "--functions", "80"],
            env=env("chief", 0),
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        for proc in servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert chief.returncode == 0, chief.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", chief.stdout).group(1))
    assert accuracy >= 0.9, chief.stdout
    assert "functions ran on workers [0, 1]" in chief.stdout, chief.stdout
