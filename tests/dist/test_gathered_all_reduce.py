"""Small agreed all-reduces run as one all-gather, combined on every rank in rank order (Note
[Small agreed all-reduces gather] in nbdist/collectives/agreed.py). 3 real gloo workers, so
that the order of a floating-point sum matters: every rank must get the same bits, and the
values of a rank-order reduction, on the hot path (one tensor) and on the other agreed path
(several tensors), while a layout too large to gather still reduces in place.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

WORKERS = 3

CODE = worker_source("gathered_all_reduce")


@pytest.fixture(scope="module")
def outputs(launch_once) -> list[dict]:
    port = free_port()
    envs = [torchrun_env(rank, WORKERS, port) for rank in range(WORKERS)]
    results = launch_once("gathered-all-reduce", lambda: run_workers(CODE, envs, timeout=180))
    assert_all_ok(results)
    return [result.result for result in results]


def test_small_layouts_gather_and_large_ones_do_not(outputs):
    for out in outputs:
        assert out["gathers"] == {"1000": True, "5000": False}


def test_every_rank_gets_the_same_bits(outputs):
    first = outputs[0]["bits"]
    assert len(first) == 8
    for out in outputs[1:]:
        for case, bits in first.items():
            assert out["bits"][case] == bits, f"ranks differ on {case}"


def test_gathered_results_are_the_rank_order_reduction(outputs):
    for out in outputs:
        assert out["matches_rank_order"] == {
            name: [True] * 4 for name in ("sum", "mean", "max", "min")
        }


def test_an_agreed_call_costs_one_collective_gathered_or_not(outputs):
    for out in outputs:
        assert set(out["collectives"].values()) == {1}, out["collectives"]
