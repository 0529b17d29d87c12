"""`nbdist demo` on real engines, as a user runs it: a subprocess, its output, its folder.

Each test runs `python -m nbdist demo ...` and checks the exit status, the one-line messages,
the files written, and that no process of the demo (engines, controller) is left, also after
a real SIGINT during engine start and during training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nbdist.testing import assert_processes_gone

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def env() -> dict[str, str]:
    variables = dict(os.environ)
    paths = [str(ROOT), *[p for p in variables.get("PYTHONPATH", "").split(os.pathsep) if p]]
    variables["PYTHONPATH"] = os.pathsep.join(paths)
    variables["MPLBACKEND"] = "Agg"
    return variables


def demo(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbdist", "demo", *argv], capture_output=True, text=True,
        timeout=TIMEOUT_S, cwd=cwd, env=env(),
    )  # fmt: skip


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_demo_trains_on_engines_and_writes_its_folder(tmp_path):
    done = demo("--no-progress", "--epochs", "6", cwd=tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "nbdist-demo"  # the default, relative to where it runs
    assert f"writing into {out}" in done.stdout
    assert "epoch 6/6" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engines"] == 2
    assert metrics["accuracy"] >= 0.95, metrics["epoch_accuracies"]
    assert metrics["replicas_identical"] is True
    assert len(metrics["epoch_losses"]) == 6
    assert metrics["epoch_losses"][-1] < metrics["epoch_losses"][0]
    # each epoch's report comes from its last step: its loss is the mean of that epoch's steps
    steps = metrics["steps_per_epoch"]
    assert len(metrics["step_losses"]) == 6 * steps
    for epoch, loss in enumerate(metrics["epoch_losses"]):
        window = metrics["step_losses"][epoch * steps : (epoch + 1) * steps]
        assert loss == pytest.approx(sum(window) / steps, rel=1e-5)
    assert set(metrics["timings"]) >= {"start", "first_step", "training", "stop", "total"}
    assert (out / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the placement view counts the CNN's parameters and buffers on each replica
    from nbdist.app.training import build_model

    cnn = build_model()
    size = sum(t.numel() * t.element_size() for t in [*cnn.parameters(), *cnn.buffers()])
    assert metrics["bytes_held"] == {"0": size, "1": size}
    assert "Traceback" not in done.stderr


def test_zero_engines_is_a_usage_error(tmp_path):
    done = demo("--engines", "0", cwd=tmp_path)

    assert done.returncode == 2
    assert "argument --engines: must be at least 1, got 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "nbdist-demo").exists()


def test_far_too_many_engines_is_refused_before_starting(tmp_path):
    done = demo("--engines", str(64 * (os.cpu_count() or 1)), cwd=tmp_path)

    assert done.returncode == 2
    assert "more than 4 per core" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_more_engines_than_cores_warns_and_runs(tmp_path):
    engines = (os.cpu_count() or 1) + 1
    done = demo("--engines", str(engines), "--epochs", "1", "--no-progress", "--out", "o",
                cwd=tmp_path)  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    assert f"warning: {engines} engines on" in done.stderr
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["engines"] == engines


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_unwritable_out_is_a_one_line_error(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "file":
        target.write_text("not a folder")
    else:
        target.mkdir()
        target.chmod(0o500)
        if os.access(target, os.W_OK):  # root writes anywhere
            target.chmod(0o700)
            target = Path("/proc/nbdist-demo")  # no one can create a folder here
    done = demo("--out", str(target), cwd=tmp_path)

    assert done.returncode == 1
    assert "nbdist demo: error:" in done.stderr
    assert "pass a folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "starting" not in done.stdout  # refused before any engine started


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("when", ["start", "training"])
def test_ctrl_c_stops_the_engines(tmp_path, when):
    marker = "starting 2 engine" if when == "start" else "training a CNN"
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "nbdist", "demo", "--epochs", "200", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env(),
    )  # fmt: skip
    seen: list[int] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        lines = []
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        else:
            pytest.fail(f"the demo ended before {marker!r}:\n{''.join(lines)}")
        if when == "start":  # wait until some engine process exists, so start is under way
            while time.monotonic() < deadline and len(descendants(process.pid)) < 2:
                time.sleep(0.05)
        seen = descendants(process.pid)
        assert seen, "the demo started no process"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert "Traceback" not in err
    assert_processes_gone(tuple(seen), deadline_s=30)
