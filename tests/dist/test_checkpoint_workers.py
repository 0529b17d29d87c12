"""nd.checkpoint with MultiWorkerMirroredStrategy across real worker processes (gloo, CPU).

One worker writes, every worker waits for the complete file; a run saved on 2 workers resumes
on 3 and ends at the parameters of an uninterrupted 2-worker run (within 1e-6); a bad path, a
truncated file, another model or a file missing on one host raise a clear error on every
worker, never a hang.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env
from tests.dist.workers import worker_source

pytestmark = pytest.mark.dist

LAUNCH_TIMEOUT = 90
STEPS, SAVE_AT, GLOBAL_BATCH = 8, 3, 12

TRAIN = worker_source("checkpoint_train")

ERRORS = worker_source("checkpoint_errors")


ONLY_WRITER = worker_source("checkpoint_only_writer")


MANAGER = worker_source("checkpoint_manager")


def test_checkpoint_manager_on_two_workers_one_writes_every_worker_knows(tmp_path):
    outs = _launch(MANAGER, 2, FOLDER=str(tmp_path))
    for out in outs:
        assert out["paths"] == ["ckpt-1", "ckpt-2", "ckpt-3"]
        assert out["checkpoints"] == ["ckpt-2", "ckpt-3"]
        assert out["files"] == ["checkpoint", "ckpt-2", "ckpt-3"]  # ckpt-1 deleted once
        assert out["restored"] == "ckpt-3" and out["weight_nonzero"]
        assert out["next"] == "ckpt-4" and out["after"] == ["ckpt-3", "ckpt-4"]
        assert "is a file, not a directory" in out["blocked"]
    assert [out["writes"] for out in outs] == [3, 0]  # should_checkpoint: worker 0 only


def _launch(code: str, workers: int, **env: str):
    port = free_port()
    envs = [{**torchrun_env(rank, workers, port), **env} for rank in range(workers)]
    results = run_workers(code, envs, timeout=LAUNCH_TIMEOUT)
    assert_all_ok(results)
    return [result.result for result in results]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    env = {"CKPT": str(folder / "run.pt"), "STEPS": str(STEPS), "SAVE_AT": str(SAVE_AT)}
    full = _launch(TRAIN, 2, PHASE="full", **env)
    first = _launch(TRAIN, 2, PHASE="first", **env)
    resumed = _launch(TRAIN, 3, PHASE="resume", **env)
    return full, first, resumed


def test_two_workers_resume_on_three_like_an_uninterrupted_run(runs):
    full, first, resumed = runs
    expected = torch.tensor([v for p in full[0]["params"] for v in p])
    for out in resumed:
        got = torch.tensor([v for p in out["params"] for v in p])
        assert torch.allclose(got, expected, atol=1e-6, rtol=0), (got - expected).abs().max()
        assert out["left"] == 0  # resumed exactly after the saved batch
        assert out["seen"] == STEPS * GLOBAL_BATCH  # SUM variable: 36 saved, split over 3
    for out in first:
        assert out["ckpt_exists_after_save"]  # every worker returns after the file is complete
        assert out["seen"] == SAVE_AT * GLOBAL_BATCH
        assert out["left"] == STEPS - SAVE_AT


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    return _launch(ERRORS, 2, FOLDER=str(tmp_path_factory.mktemp("errors")))


def test_one_worker_writes_and_sync_on_read_values_are_aggregated(errors):
    assert [out["save"].get("ok") for out in errors] == [True, True]
    assert [out["writes"] for out in errors] == [1, 0]  # should_checkpoint: worker 0 only
    assert [out["saved_total"] for out in errors] == [3.0, 3.0]  # 1 + 2 across workers


def test_integer_sum_sync_on_read_keeps_its_exact_total_across_workers(errors):
    # 9 over 2 workers: 5 on replica 0 (the remainder), 4 on replica 1; assign(5) reads 5.
    assert [out["int_sum"]["component"] for out in errors] == [5, 4]
    for out in errors:
        assert out["int_sum"] | {"component": None} == {
            "saved": 9, "restored": 9, "assigned": 5, "component": None,
        }  # fmt: skip


@pytest.mark.parametrize(
    ("case", "kind", "pattern"),
    [
        ("unwritable", "CheckpointError", "is a file, not a directory"),
        ("another_model", "CheckpointMismatchError", "holds parameters for a model with"),
        ("truncated", "CheckpointError", "truncated: the file was not completely written"),
    ],
)
def test_bad_checkpoints_raise_the_same_error_on_every_worker(errors, case, kind, pattern):
    for out in errors:
        error = out[case]
        assert error.get("type") == kind, error
        assert re.search(pattern, error["message"]), error["message"]
        assert "NbdistError" in error["bases"]
        assert error["elapsed"] < 20


def test_a_file_missing_on_one_worker_fails_the_restore_on_both(errors):
    mine, theirs = errors[1]["missing_on_one_worker"], errors[0]["missing_on_one_worker"]
    assert mine["type"] == "CheckpointError" and "does not exist" in mine["message"]
    assert theirs["type"] == "CheckpointError"
    assert "failed on worker 1" in theirs["message"] and "does not exist" in theirs["message"]
    assert [out["still_usable"].get("ok") for out in errors] == [True, True]


def test_saving_on_the_writer_only_names_the_mistake(tmp_path):
    writer, _ = _launch(ONLY_WRITER, 2, FOLDER=str(tmp_path))
    assert writer["type"] == "CheckpointError", writer
    assert "worker(s) [1] did not take part" in writer["message"]
    assert "not only where strategy.extended.should_checkpoint is True" in writer["message"]
    assert "This worker wrote the file completely" in writer["message"]
    assert writer["elapsed"] < 30


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi_worker_digits.py"
_LOSS = re.compile(r"^epoch (\d+)/(\d+)  loss ([0-9.]+)$", re.MULTILINE)
_ACCURACY = re.compile(r"^final test accuracy: [0-9.]+ \((\d+)/360\)$", re.MULTILINE)


def _example(workers: int, *args: str) -> str:
    code = f"""
        import runpy, sys
        sys.argv = {[str(EXAMPLE), *args]!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
    """
    port = free_port()
    envs = [torchrun_env(rank, workers, port) for rank in range(workers)]
    results = run_workers(code, envs, timeout=LAUNCH_TIMEOUT, cwd=EXAMPLE.parents[1])
    assert_all_ok(results)
    return results[0].stdout


@pytest.mark.slow
def test_the_example_script_resumes_on_three_workers(tmp_path):
    checkpoint = str(tmp_path / "digits.pt")
    uninterrupted = _example(2, "--epochs", "2")
    first = _example(2, "--epochs", "1", "--checkpoint", checkpoint)
    resumed = _example(3, "--epochs", "2", "--checkpoint", checkpoint)
    assert "resumed from" in resumed and "after epoch 1" in resumed
    assert [e for e, _, _ in _LOSS.findall(first)] == ["1"]
    assert [e for e, _, _ in _LOSS.findall(resumed)] == ["2"]  # epoch 1 is not trained again
    expected = float(_LOSS.findall(uninterrupted)[-1][2])
    assert abs(float(_LOSS.findall(resumed)[-1][2]) - expected) <= 2e-6
    assert _ACCURACY.findall(resumed) == _ACCURACY.findall(uninterrupted)


UNEVEN = worker_source("checkpoint_uneven")


def test_a_save_with_workers_at_different_iterator_positions_is_refused_on_both(tmp_path):
    # Before: worker 0's position (2 batches) was written silently; after a restore worker 1
    # skipped its share of batch 2, which it never trained on.
    outs = _launch(UNEVEN, 2, FOLDER=str(tmp_path))
    for out in outs:
        error = out["save"]
        assert error.get("type") == "CheckpointError", error
        assert "NbdistError" in error["bases"]
        message = error["message"]
        assert "'iterator' is at different positions on the workers" in message
        assert "worker 0: 2 batches (8 examples), worker 1: 1 batches (4 examples)" in message
        assert "worker(s) [1] would skip" in message
        assert "Save at a step boundary where every worker has taken the same number" in message
        assert not out["written"]
        assert out["saved_batches"] == 2
