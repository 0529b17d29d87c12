"""`nd.Cluster(collective_timeout=..., communication_options=...)`: the engines' strategy gets
them (a collective a peer does not join fails after the given timeout, not 300 s; fp16
compression rounds the engines' all-reduce), and bad values are refused before anything starts.
"""

from __future__ import annotations

import time

import pytest
import torch

import nbdist as nd
from nbdist.cluster import Cluster
from nbdist.cluster.launch.plan import make_plan, with_communication
from nbdist.cluster.launch.startup import rank_engines
from nbdist.errors import ArgumentTypeError, InvalidArgumentError

from .conftest import stop_and_check

pytestmark = pytest.mark.cluster

Options = nd.experimental.CommunicationOptions


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"collective_timeout": 0}, InvalidArgumentError, "positive number of seconds, got 0"),
        ({"collective_timeout": -5.0}, InvalidArgumentError, "positive number.*got -5.0"),
        ({"collective_timeout": float("inf")}, InvalidArgumentError, "positive number.*inf"),
        ({"collective_timeout": "60"}, ArgumentTypeError, "number of seconds, got str '60'"),
        ({"collective_timeout": True}, ArgumentTypeError, "number of seconds, got bool"),
        ({"communication_options": {"timeout_seconds": 5}}, ArgumentTypeError,
         "must be nd.experimental.CommunicationOptions, got dict"),
        ({"collective_timeout": 5, "communication_options": Options(timeout_seconds=6)},
         InvalidArgumentError, "disagree; give the timeout once"),
        ({"backend": "gloo", "communication_options": Options(implementation="NCCL")},
         InvalidArgumentError, "backend='gloo' and communication_options.implementation=NCCL"),
        ({"communication_options": Options(implementation="NCCL")}, InvalidArgumentError,
         "NCCL needs GPU engines"),
        ({"strategy": "parameter_server", "communication_options": Options(compression="fp16")},
         InvalidArgumentError, "set only the timeout"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_before_anything_starts(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        Cluster(**{"n": 3, "gpus": "none", **kwargs})


def test_the_options_reach_each_engines_bootstrap_config():
    plan = with_communication(
        make_plan(n=2, gpu_ids=()),
        collective_timeout=7,
        communication_options=Options(bytes_per_pack=1024, compression="bf16"),
    )
    described = [{"host": "h", "cuda_visible_devices": None, "address": "127.0.0.1",
                  "free_port": 1234}] * 2  # fmt: skip
    for _, _, config in rank_engines(plan, [0, 1], described):
        assert (config["timeout_seconds"], config["bytes_per_pack"], config["compression"]) == (
            7.0,
            1024,
            "bf16",
        )
    assert plan.collective_timeout == 7.0
    assert make_plan(n=2, gpu_ids=()).collective_timeout == 300.0  # TF's default
    ring = with_communication(make_plan(n=2, gpu_ids=()), None, Options(implementation="RING"))
    assert (ring.backend, ring.implementation.value) == ("gloo", "RING")


HALF_BEHIND = r"""
import time
began = time.monotonic()
if strategy.cluster_resolver.task_id == 1:
    time.sleep(8)  # alive, but late for the collective
try:
    strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(1)))
    outcome = "completed"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"
waited = time.monotonic() - began
"""


def test_engines_use_the_options_given_to_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cluster = Cluster(
        n=2, gpus="none", timeout=90.0,
        communication_options=Options(timeout_seconds=3, compression="fp16"),
    )  # fmt: skip
    try:
        cluster.start()
        # fp16 compression: 1 + 2**-12 is not a float16 number, so the sum rounds to 2.0
        # (a tensor over 16 KiB: smaller all-reduces travel inline, uncompressed).
        total = cluster.strategy.run(
            lambda: nd.get_replica_context().all_reduce("sum", torch.full((8192,), 1 + 2**-12))
        )
        assert [v.unique().tolist() for v in total.values] == [[2.0], [2.0]]
        begin = time.monotonic()
        cluster.client[:].execute(HALF_BEHIND, block=True)
        outcome, waited = cluster.pull("outcome").values[0], cluster.pull("waited").values[0]
        assert outcome.startswith("CollectiveTimeoutError"), outcome
        assert "rank 1 never called this collective" in outcome, outcome
        # 3 s (and the diagnosis, ~2 s), before replica 1 arrives at 8 s: with the default
        # 300 s the all-reduce would have waited for it and completed.
        assert 2.9 < waited < 8, waited
        assert time.monotonic() - begin < 60
    finally:
        stop_and_check(cluster)
