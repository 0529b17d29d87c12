"""resolve_cluster: which launcher's environment wins, and what is not one."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import (
    SlurmClusterResolver,
    TFConfigClusterResolver,
    TorchrunClusterResolver,
    resolve_cluster,
)
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import (
    TF_CONFIG_CHIEF_WORKER_PS,
    TORCHRUN,
    set_slurm,
    set_tf_config,
)

SLURM_STEP = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
}


def test_resolve_cluster_nothing_set():
    assert resolve_cluster() is None
    assert resolve_cluster({}) is None


def test_resolve_cluster_order_tf_config_then_torchrun_then_slurm(monkeypatch):
    set_slurm(monkeypatch, **SLURM_STEP)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    slurm = resolve_cluster()
    assert isinstance(slurm, SlurmClusterResolver)
    assert slurm.get_task_info() == ("worker", 1)
    slurm.cluster_spec()
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # auto_set_gpu=False

    set_slurm(monkeypatch, **TORCHRUN)
    assert isinstance(resolve_cluster(), TorchrunClusterResolver)

    set_tf_config(monkeypatch, TF_CONFIG_CHIEF_WORKER_PS)
    resolver = resolve_cluster()
    assert isinstance(resolver, TFConfigClusterResolver)
    assert resolver.master() == "host2:2222"


def test_resolve_cluster_blank_tf_config_falls_through():
    env = {"TF_CONFIG": " ", **TORCHRUN}
    assert isinstance(resolve_cluster(env), TorchrunClusterResolver)


def test_resolve_cluster_half_a_torchrun_environment_is_not_one():
    assert resolve_cluster({"RANK": "0"}) is None
    assert resolve_cluster({"WORLD_SIZE": "2"}) is None


@pytest.mark.parametrize(
    "env",
    [
        # a batch script: job-level variables only, no step
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-4]"},
        # a one-task step (e.g. `srun --pty jupyter lab`)
        {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"},
        # an allocation without a task rank
        {k: v for k, v in SLURM_STEP.items() if k != "SLURM_PROCID"},
    ],
)
def test_resolve_cluster_slurm_needs_a_multi_task_step(env):
    assert resolve_cluster(env) is None


def test_resolve_cluster_malformed_sources_raise():
    with pytest.raises(ClusterConfigError, match="TF_CONFIG is not valid JSON"):
        resolve_cluster({"TF_CONFIG": "{", **TORCHRUN})
    with pytest.raises(ClusterConfigError, match="RANK is 9 but WORLD_SIZE is 4"):
        resolve_cluster({**TORCHRUN, "RANK": "9"})
    with pytest.raises(ClusterConfigError, match="SLURM_STEP_NODELIST is 'node\\[1-'"):
        resolve_cluster({**SLURM_STEP, "SLURM_STEP_NODELIST": "node[1-"})
