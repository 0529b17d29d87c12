"""The buffers a small gathered all-reduce reuses call after call (Note [Gather buffers] in
nbdist/collectives/direct.py) never leak into a result and are never reused unsafely: each
result is a new tensor, a layout first used inside `torch.inference_mode()` still works
outside it, a call that finds the buffers taken makes its own, a failed collective drops its
layout's buffers, and the buffers kept stay within their byte budget. 2 real gloo workers.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

CODE = worker_source("gather_buffers")


@pytest.fixture(scope="module")
def outputs(launch_once) -> list[dict]:
    port = free_port()
    envs = [torchrun_env(rank, 2, port) for rank in range(2)]
    results = launch_once("gather-buffers", lambda: run_workers(CODE, envs, timeout=120))
    assert_all_ok(results)
    return [result.result for result in results]


def test_a_repeated_small_layout_keeps_its_buffers(outputs):
    for out in outputs:
        assert out["kept"] and out["grid_kept"]


def test_each_result_is_a_new_tensor(outputs):
    for out in outputs:
        assert out["first_after_second"] == [3.0]
        assert out["second"] == [20.0]
        assert out["results_share_no_buffer"]
        assert out["after_user_write"] == [1.0]
    assert outputs[0]["rows_hold_last_inputs"] == [[0.0], [1.0]]  # the buffers were used


def test_shapes_and_ops_on_the_reused_buffers(outputs):
    for out in outputs:
        assert out["grid"] == [[10, 20], True]
        assert out["int_mean"] == ["torch.float32", [0.5, 7.0]]


def test_a_layout_first_used_in_inference_mode_works_outside_it(outputs):
    for out in outputs:
        inside, outside, send_is_inference = out["inference"]
        assert inside == [666.0] * 3
        assert outside == [666.0] * 3
        assert send_is_inference is False


def test_a_call_that_finds_the_buffers_taken_makes_its_own(outputs):
    rank0, rank1 = outputs
    for out in outputs:
        assert out["while_taken"] == [[15.0], 1]  # right value, still one collective
        assert out["after_release"][0] == [4.0]
    # Rank 0's held buffers still hold the call before (-1 from each); rank 1's took this one.
    assert rank0["rows_while_taken"] == [[-1.0], [-1.0]]
    assert rank1["rows_while_taken"] == [[5.0], [10.0]]
    for out in outputs:
        assert out["after_release"][1] == [2.0]  # used again once free


def test_kept_buffers_stay_within_their_budget(outputs):
    for out in outputs:
        assert out["budget"] == [True, True]


def test_a_failed_collective_drops_its_layouts_buffers(outputs):
    rank0 = outputs[0]
    assert rank0["failure"] == "CollectiveTimeoutError"
    assert 3.5 <= rank0["failure_elapsed"] < 15
    assert rank0["dropped"] is True
