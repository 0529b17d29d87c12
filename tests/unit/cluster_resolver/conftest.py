"""Every test of nbdist.cluster_resolver starts outside any launcher (no TF_CONFIG, torchrun or
Slurm variables).
"""

from __future__ import annotations

import pytest

LAUNCH_VARS = [
    "TF_CONFIG",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Every test starts outside any launcher; CUDA_VISIBLE_DEVICES is restored afterwards."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
