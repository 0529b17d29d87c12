"""nd.checkpoint.CheckpointManager in one process: TF's numbering, keeping, state file and
restore-or-initialise, on every in-process strategy; the directory is created as TF's is.

tests/dist/test_checkpoint_workers.py and tests/cluster/test_checkpoint_cluster.py repeat it
with real worker processes and engines (one worker writes and deletes).
"""

from __future__ import annotations

import os

import pytest
import torch

import nbdist as nd
from nbdist.errors import ArgumentTypeError, CheckpointTypeError, InvalidArgumentError


def _names(paths):
    return [os.path.basename(p) for p in paths]


def _strategy(kind: str):
    return {
        "default": lambda: nd.get_strategy(),
        "one_device": lambda: nd.OneDeviceStrategy("cpu"),
        "mirrored": lambda: nd.MirroredStrategy(["cpu:0", "cpu:1"]),
        "central_storage": lambda: nd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
        "multi_worker_single": lambda: nd.MultiWorkerMirroredStrategy(),
    }[kind]()


STRATEGIES = ["default", "one_device", "mirrored", "central_storage", "multi_worker_single"]


@pytest.mark.parametrize("kind", STRATEGIES)
def test_numbered_saves_keep_the_newest_and_create_the_directory(tmp_path, kind):
    strategy = _strategy(kind)
    with strategy.scope():
        model = torch.nn.Linear(3, 2)
    folder = tmp_path / "not" / "yet" / "there"
    manager = nd.checkpoint.CheckpointManager(folder, max_to_keep=2, model=model)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    assert not folder.exists()  # created by the first save, as TF's Checkpoint.write does
    paths = [manager.save() for _ in range(3)]
    assert paths == [str(folder / f"ckpt-{n}") for n in (1, 2, 3)]
    assert _names(manager.checkpoints) == ["ckpt-2", "ckpt-3"]
    assert manager.latest_checkpoint == str(folder / "ckpt-3")
    assert sorted(os.listdir(folder)) == ["checkpoint", "ckpt-2", "ckpt-3"]  # ckpt-1 deleted
    state = (folder / "checkpoint").read_text().splitlines()
    assert state[:3] == [
        'model_checkpoint_path: "ckpt-3"',
        'all_model_checkpoint_paths: "ckpt-2"',
        'all_model_checkpoint_paths: "ckpt-3"',
    ]
    assert [line.split(":")[0] for line in state[3:]] == [
        "all_model_checkpoint_timestamps",
        "all_model_checkpoint_timestamps",
        "last_preserved_timestamp",
    ]
    assert nd.checkpoint.latest_checkpoint(folder) == str(folder / "ckpt-3")
    assert sorted(nd.checkpoint.read(paths[-1])["model"]) == ["bias", "weight"]


def test_a_new_manager_finds_the_checkpoints_and_restore_continues_the_numbering(tmp_path):
    model = torch.nn.Linear(3, 2)
    first = nd.checkpoint.CheckpointManager(tmp_path, max_to_keep=3, model=model)
    for _ in range(4):
        first.save()
    saved = model.weight.detach().clone()
    fresh = torch.nn.Linear(3, 2)
    again = nd.checkpoint.CheckpointManager(tmp_path, max_to_keep=3, model=fresh)
    assert again.latest_checkpoint == str(tmp_path / "ckpt-4")
    assert _names(again.checkpoints) == ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert again.save_counter == 0  # as a new tf.train.Checkpoint, until it restores
    assert again.restore_or_initialize() == str(tmp_path / "ckpt-4")
    assert torch.equal(fresh.weight, saved)
    assert again.save_counter == 4
    assert _names([again.save()]) == ["ckpt-5"]
    assert _names(again.checkpoints) == ["ckpt-3", "ckpt-4", "ckpt-5"]


def test_restore_or_initialize_calls_init_fn_when_there_is_no_checkpoint(tmp_path):
    calls = []
    manager = nd.checkpoint.CheckpointManager(
        tmp_path / "empty", init_fn=lambda: calls.append(1), model=torch.nn.Linear(2, 2)
    )
    assert manager.restore_or_initialize() is None
    assert calls == [1]


def test_checkpoint_number_names_the_file_and_the_counter_still_counts(tmp_path):
    step = nd.Variable(torch.tensor(100))
    manager = nd.checkpoint.CheckpointManager(tmp_path, max_to_keep=None, w=torch.ones(2))
    assert _names([manager.save(checkpoint_number=step)]) == ["ckpt-100"]
    assert _names([manager.save()]) == ["ckpt-2"]  # save_counter: 2
    assert _names([manager.save(checkpoint_number=7)]) == ["ckpt-7"]
    assert _names(manager.checkpoints) == ["ckpt-100", "ckpt-2", "ckpt-7"]  # None keeps all
    manager.save(checkpoint_number=100)  # saved again: it becomes the newest
    assert _names(manager.checkpoints) == ["ckpt-2", "ckpt-7", "ckpt-100"]


def test_keep_checkpoint_every_n_hours_preserves_what_leaves_the_kept_set(tmp_path):
    manager = nd.checkpoint.CheckpointManager(
        tmp_path, max_to_keep=1, keep_checkpoint_every_n_hours=1e-12, w=torch.ones(1)
    )
    for _ in range(3):
        manager.save()
    assert _names(manager.checkpoints) == ["ckpt-3"]  # preserved ones are no longer listed
    assert {"ckpt-1", "ckpt-2", "ckpt-3"} <= set(os.listdir(tmp_path))  # but kept on disk


def test_checkpoint_interval_skips_saves_until_the_step_counter_advanced(tmp_path):
    step = nd.Variable(torch.tensor(0))
    manager = nd.checkpoint.CheckpointManager(
        tmp_path, step_counter=step, checkpoint_interval=2, w=torch.ones(1)
    )
    saved = []
    for value in range(5):
        step.assign(torch.tensor(value))
        saved.append(manager.save())
    assert _names([p for p in saved if p]) == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert saved[1] is None and saved[3] is None
    assert manager.save() is None  # the same step twice: never
    step.assign(torch.tensor(5))
    assert manager.save(check_interval=False) is not None


def test_save_inside_run_of_mirrored_strategy_writes_once(tmp_path):
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    with strategy.scope():
        model = torch.nn.Linear(2, 2)
    manager = nd.checkpoint.CheckpointManager(tmp_path, max_to_keep=2, model=model)
    result = strategy.run(manager.save)
    assert result == str(tmp_path / "ckpt-1")  # the same path on every replica
    assert manager.save_counter == 1
    assert strategy.run(manager.restore_or_initialize) == str(tmp_path / "ckpt-1")


# --- bad input -------------------------------------------------------------------------------


def test_a_directory_below_a_file_is_refused_with_the_fix(tmp_path):
    blocker = tmp_path / "run.log"
    blocker.write_text("x")
    with pytest.raises(nd.CheckpointError) as info:
        nd.checkpoint.CheckpointManager(blocker / "ckpts", model=torch.nn.Linear(2, 2))
    message = str(info.value)
    assert str(blocker / "ckpts") in message and "is a file, not a directory" in message
    assert "Give a directory path" in message


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's sysfs")
def test_a_directory_that_cannot_be_created_fails_the_save_and_keeps_the_list():
    # sysfs refuses new directories to every user, root included (unlike a chmod'ed one).
    manager = nd.checkpoint.CheckpointManager("/sys/nbdist-ckpts", w=torch.ones(1))
    with pytest.raises(nd.CheckpointError) as info:
        manager.save()
    message = str(info.value)
    assert "'/sys/nbdist-ckpts/ckpt-1'" in message and "cannot be created" in message
    assert "directory you can write to" in message
    assert manager.checkpoints == [] and manager.latest_checkpoint is None
    assert manager.save_counter == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"max_to_keep": 0}, InvalidArgumentError, "positive integer or None for max_to_keep"),
        ({"max_to_keep": 2.5}, ArgumentTypeError, "max_to_keep must be a whole number"),
        ({"checkpoint_name": "a/b"}, InvalidArgumentError, "no directory"),
        ({"checkpoint_interval": 5}, InvalidArgumentError, "needs step_counter"),
        ({"keep_checkpoint_every_n_hours": -1}, InvalidArgumentError, "positive number"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        nd.checkpoint.CheckpointManager(tmp_path, w=torch.ones(1), **kwargs)


def test_no_objects_is_refused(tmp_path):
    with pytest.raises(CheckpointTypeError, match="was given no objects"):
        nd.checkpoint.CheckpointManager(tmp_path)


def test_a_corrupted_state_file_is_ignored_with_a_warning_as_tf_does(tmp_path):
    (tmp_path / "checkpoint").write_text("this is not a state\n")
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        manager = nd.checkpoint.CheckpointManager(tmp_path, w=torch.ones(1))
    assert manager.latest_checkpoint is None
