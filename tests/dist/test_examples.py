"""examples/multi_worker_digits.py runs unchanged under torchrun, TF_CONFIG and as one process.

Each launch trains for 2 epochs; the two-worker launches must agree bit for bit (same losses,
same accuracy), the single process with them to within 0.01 accuracy, and all must learn
(accuracy > 0.85). Each launch runs once per pytest session and is shared between the tests
(and the pytest-xdist workers, through a locked file in the session's temporary folder); every
process started is killed and reaped whatever happens (and conftest.py's autouse fixture checks
that no child process is left behind).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist.testing import (
    assert_all_ok,
    free_port,
    free_ports,
    run_workers,
    tf_config_env,
    worker_env,
)

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]  # two launches of up to 90 s each

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "multi_worker_digits.py"
EPOCHS = 2
LAUNCH_TIMEOUT_S = 90  # one launch; a test may also wait for another worker's torchrun launch
_ACCURACY = re.compile(r"^final test accuracy: ([0-9.]+) \((\d+)/(\d+)\)$", re.MULTILINE)
_EPOCH = re.compile(r"^epoch (\d+)/(\d+)  loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture(scope="session")
def launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """`launch(how)`: the example's run under `how`, launched at most once per session."""
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # a pytest-xdist worker: share with the others
        root = root.parent

    def once(how: str) -> Launch:
        saved = root / f"nbdist-example-{how}.json"
        with open(root / f"nbdist-example-{how}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running it: wait for its result
            if saved.exists():
                return Launch(**json.loads(saved.read_text()))
            result = _launch(how)
            saved.write_text(json.dumps(dataclasses.asdict(result)))
            return result

    return once


@dataclasses.dataclass(frozen=True)
class Launch:
    """What one launch of the example printed (rank 0's lines)."""

    how: str
    accuracy: float
    correct: int
    losses: list[str]  # per-epoch losses as printed, compared as text (bit for bit)
    output: str


def _parse(how: str, output: str) -> Launch:
    accuracies = _ACCURACY.findall(output)
    assert len(accuracies) == 1, f"{how}: expected one accuracy line from rank 0:\n{output}"
    (accuracy, correct, total) = accuracies[0]
    epochs = _EPOCH.findall(output)
    assert [(int(e), int(n)) for e, n, _ in epochs] == [(e, EPOCHS) for e in range(1, EPOCHS + 1)]
    assert int(total) == 360
    return Launch(how, float(accuracy), int(correct), [x for _, _, x in epochs], output)


def _run_command(argv: list[str], how: str) -> str:
    """Run `argv` in its own process group; kill the whole group afterwards, whatever happens."""
    process = subprocess.Popen(
        argv, env=worker_env({}), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{how} did not finish within {LAUNCH_TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # torchrun's workers, if any outlived it
        process.wait()
    assert process.returncode == 0, f"{how} exited with {process.returncode}:\n{output[-4000:]}"
    return output


def _launch(how: str) -> Launch:
    args = [str(EXAMPLE), "--epochs", str(EPOCHS)]
    if how == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port()), *args]  # fmt: skip
        return _parse(how, _run_command(argv, how))
    if how == "single":
        return _parse(how, _run_command([sys.executable, *args], how))
    assert how == "tf_config"
    ports = free_ports(2)
    code = f"""
        import runpy, sys
        sys.argv = {args!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
    """
    results = run_workers(
        code, [tf_config_env(r, 2, ports) for r in range(2)], timeout=LAUNCH_TIMEOUT_S,
        cwd=ROOT, fail_fast=True,
    )  # fmt: skip
    assert_all_ok(results)
    assert not _ACCURACY.search(results[1].stdout), "only rank 0 prints the accuracy"
    assert not _EPOCH.search(results[1].stdout), "only rank 0 prints the losses"
    return _parse(how, results[0].stdout)


def test_example_trains_under_torchrun(launch):
    run = launch("torchrun")
    assert "2 replica(s)" in run.output
    assert run.accuracy > 0.85, run.output


def test_example_with_tf_config_matches_torchrun_exactly(launch):
    run = launch("tf_config")
    assert "2 replica(s)" in run.output
    assert run.accuracy > 0.85, run.output
    reference = launch("torchrun")
    assert (run.correct, run.losses) == (reference.correct, reference.losses)


def test_example_in_one_process_matches_two_workers(launch):
    run = launch("single")
    assert "1 replica(s)" in run.output
    assert run.accuracy > 0.85, run.output
    reference = launch("torchrun")
    assert abs(run.accuracy - reference.accuracy) <= 0.01, (run.output, reference.output)
