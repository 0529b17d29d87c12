"""TorchrunClusterResolver: the torchrun environment and every bad variable."""

from __future__ import annotations

import pytest

from nbdist.cluster_resolver import TorchrunClusterResolver
from nbdist.errors import ClusterConfigError
from tests.unit.cluster_resolver.helpers import TORCHRUN, fake_gpu_count, set_slurm


def test_torchrun_resolver(monkeypatch):
    set_slurm(monkeypatch, **TORCHRUN)
    resolver = TorchrunClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert (resolver.world_size, resolver.local_rank, resolver.local_world_size) == (4, 1, 2)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["10.0.0.1:29500", "10.0.0.1:29501", "10.0.0.1:29502", "10.0.0.1:29503"]
    }
    assert resolver.cluster_spec().num_tasks("worker") == 4
    assert resolver.master() == "10.0.0.1:29500"
    assert resolver.master(rpc_layer="tcp") == "tcp://10.0.0.1:29500"
    assert resolver.master("worker", 2) == "10.0.0.1:29502"
    assert resolver.rpc_layer is None
    assert resolver.environment == ""
    fake_gpu_count(monkeypatch, 2)
    assert resolver.num_accelerators() == {"GPU": 2}


def test_torchrun_without_local_variables():
    env = {k: v for k, v in TORCHRUN.items() if not k.startswith("LOCAL")}
    resolver = TorchrunClusterResolver(environ=env)
    assert (resolver.local_rank, resolver.local_world_size) == (None, None)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"RANK": "4"}, r"RANK is 4 but WORLD_SIZE is 4, so ranks run 0..3"),
        ({"RANK": "one"}, r"RANK is 'one'; it must be an integer >= 0"),
        ({"RANK": "-1"}, r"RANK is '-1'; it must be an integer >= 0"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE is '0'; it must be an integer >= 1"),
        ({"WORLD_SIZE": "4.0"}, r"WORLD_SIZE is '4.0'"),
        ({"RANK": None}, r"RANK is not set, so this is not a torchrun launch"),
        ({"WORLD_SIZE": None}, r"WORLD_SIZE is not set"),
        ({"LOCAL_RANK": "x"}, r"LOCAL_RANK is 'x'; it must be an integer >= 0"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK is 2 but LOCAL_WORLD_SIZE is 2"),
        ({"LOCAL_WORLD_SIZE": "0"}, r"LOCAL_WORLD_SIZE is '0'; it must be an integer >= 1"),
        ({"LOCAL_WORLD_SIZE": "8"}, r"LOCAL_WORLD_SIZE is 8, more than WORLD_SIZE 4"),
        ({"MASTER_ADDR": None}, r"MASTER_ADDR is None: with RANK and WORLD_SIZE set"),
        ({"MASTER_ADDR": " "}, r"MASTER_ADDR is ' '"),
        ({"MASTER_PORT": None}, r"MASTER_PORT is not set"),
        ({"MASTER_PORT": "http"}, r"MASTER_PORT has port 'http', which is not an integer"),
        ({"MASTER_PORT": "0"}, r"MASTER_PORT has port '0', outside the valid range"),
        ({"MASTER_PORT": "65536"}, r"MASTER_PORT has port '65536', outside"),
        ({"MASTER_PORT": "65534"}, r"MASTER_PORT is 65534; with WORLD_SIZE 4 .* up to 65537"),
    ],
)
def test_torchrun_rejects(monkeypatch, changes, match):
    env = dict(TORCHRUN)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    set_slurm(monkeypatch, **env)
    with pytest.raises(ClusterConfigError, match=match):
        TorchrunClusterResolver()
