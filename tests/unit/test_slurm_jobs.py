"""`nbdist.cluster.launch.slurm_jobs`: what sbatch said reaches the error, and which pending
reasons mean a job will never run (the real Slurm is exercised in tests/hosts/test_slurm.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from nbdist.cluster.launch.slurm_jobs import (
    DELETE_COMMAND,
    JOB_ID_REGEXP,
    SUBMIT_COMMAND,
    never_runs,
    refusal,
)


def test_sbatchs_complaint_on_stderr_reaches_the_message(tmp_path):
    # the real submit command, run where no sbatch is on PATH: the shell's complaint (on
    # stderr) must be in what ipyparallel's check_output keeps
    (tmp_path / "sh").symlink_to(shutil.which("sh"))
    env = {**os.environ, "PATH": str(tmp_path)}  # a shell, and no sbatch
    with pytest.raises(subprocess.CalledProcessError) as info:
        subprocess.check_output([*SUBMIT_COMMAND, "job.sh"], env=env, stdin=None)
    message = refusal(info.value)
    assert message.startswith("Slurm refused the engines' job (sbatch exited with 127):")
    assert "sbatch" in message and "not found" in message
    assert "sinfo" in message and "launcher_options" in message


def test_cancelling_a_job_never_submitted_runs_no_scancel():
    done = subprocess.run([*DELETE_COMMAND, ""], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout == done.stderr == ""


def test_the_job_id_is_read_from_sbatchs_answer_only():
    answer = "sbatch: warning: 2 nodes asked, 1 used\nSubmitted batch job 731\n"
    assert re.search(JOB_ID_REGEXP, answer).group(1) == "731"


@pytest.mark.parametrize(
    ("reason", "never"),
    [
        ("JobHeldUser", True),
        ("JobHeldAdmin", True),
        ("InvalidAccount", True),
        ("InvalidQOS", True),
        ("AssocMaxNodesPerJobLimit", True),
        ("PartitionNodeLimit", True),
        ("DependencyNeverSatisfied", True),
        ("Resources", False),
        ("Priority", False),
        ("None", False),
        ("BeginTime", False),
        ("ReqNodeNotAvail, UnavailableNodes:h2", False),
    ],
)
def test_which_pending_reasons_never_clear(reason, never):
    assert never_runs(reason) is never
