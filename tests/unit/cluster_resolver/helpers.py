"""Environments and helpers shared by the tests of nbdist.cluster_resolver."""

from __future__ import annotations

import json

# TensorFlow's documented multi-worker example: a chief, two workers and a parameter server.
TF_CONFIG_CHIEF_WORKER_PS = {
    "cluster": {
        "chief": ["host0:2222"],
        "worker": ["host1:2222", "host2:2222"],
        "ps": ["host3:2222"],
    },
    "task": {"type": "worker", "index": 1},
}


def set_tf_config(monkeypatch, config) -> None:
    """Set TF_CONFIG for this test: a dict is written as JSON, a str as it is."""
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


def set_slurm(monkeypatch, **variables: str) -> None:
    """Set these environment variables for this test, e.g. `set_slurm(mp, SLURM_PROCID="0")`."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def fake_gpu_count(monkeypatch, count: int) -> None:
    """Make `torch.cuda.device_count()` answer `count` for this test."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# A torchrun environment: rank 3 of 4, the second of 2 on its node.
TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
