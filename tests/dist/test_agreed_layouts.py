"""Agreed layouts (Note [Agreed layouts] in nbdist/collectives/agreed.py): once every worker has
passed the shape check for an all-reduce, repeats of it run as one collective, and any change on
any worker, after any history, still raises the same `CollectiveMismatchError` on every worker.
2 real gloo workers.
"""

from __future__ import annotations

import re

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

CODE = worker_source("agreed_layouts")


@pytest.fixture(scope="module")
def outputs(launch_once) -> list[dict]:
    port = free_port()
    envs = [torchrun_env(rank, 2, port) for rank in range(2)]
    results = launch_once("agreed-layouts", lambda: run_workers(CODE, envs, timeout=120))
    assert_all_ok(results)
    return [result.result for result in results]


def test_agreed_path_gives_the_same_values_as_the_checked_path(outputs):
    for out in outputs:
        first = out["values"][0]
        assert first[:5] == [[3.0] * 3, [1.5] * 3, [2.0] * 3, [1.0] * 3, [3, 3]]
        assert first[5] == 3.0 * 262144
        assert first[6] == [[3.0, 3.0], [6.0]]
        # the hot path's edges: a 2-d tensor, a complex one (torch.distributed's own wrapper
        # views it as real pairs), one that requires grad, a per-call timeout
        assert first[7:11] == [[[3.0] * 2] * 2, [[0.0, 3.0]] * 2, [3.0] * 3, [3.0] * 3]
        assert first[11:] == [[2, 2], [1, 1], [1.5, 1.5], [3.0, 3.0], [[2.0], [2.0]]]
        assert out["values"][1] == first and out["values"][2] == first


def test_a_group_formed_again_reduces_on_its_new_process_group(outputs):
    for out in outputs:
        assert out["reformed"] == [[3.0] * 3] * 3
        assert out["reformed_large"] == 3.0 * 262144
        assert out["reformed_world"] == [True, True]
        assert out["released_world"]  # shutdown lets torch.distributed alone own the group


def test_repeated_all_reduces_cost_one_collective(outputs):
    for out in outputs:
        assert out["collectives_small"] == 1
        assert out["collectives_large"] == 1
        assert out["collectives_alternating"] == [1, 1]


MESSAGES = {
    "shapes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(4,\) float32"],
    "ops": [r"rank 0: all_reduce:SUM", r"rank 1: all_reduce:MAX"],
    "dtypes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(3,\) float64"],
    "structure": [r"rank 0: .*of 1 tensor", r"rank 1: .*of 2 tensor"],
    "kinds": [r"rank 0: all_reduce:SUM", r"rank 1: all_gather:0"],
    "bool": [r"rank 0: .*float32", r"rank 1: .*bool"],
    "large": [r"rank 0: .*\(262144,\) float32", r"rank 1: .*\(262145,\) float32"],
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_a_change_after_an_agreed_history_raises_on_every_worker(outputs, case):
    for out in outputs:
        error = out[case]
        assert error.get("type") == "CollectiveMismatchError", error
        for pattern in MESSAGES[case]:
            assert re.search(pattern, error["message"]), (pattern, error["message"])
        assert error["elapsed"] < 10  # found by the check, not by a timeout
        assert out[case + "_after"] == [3.0]  # and the group is still usable
