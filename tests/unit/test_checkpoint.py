"""nd.checkpoint in one process: round trips, resuming on another number of replicas, bad input.

In-process strategies (MirroredStrategy on logical CPU devices) stand for several replicas;
tests/dist and tests/cluster repeat the multi-worker parts with real processes and engines.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import nbdist as nd
from nbdist.errors import CheckpointMismatchError, CheckpointTypeError
from nbdist.strategies._replicas import iterate_components

GLOBAL_BATCH = 12  # splits evenly over 1, 2, 3, 4 and 6 replicas
STEPS = 8


def _data(batches: int = STEPS, global_batch: int = GLOBAL_BATCH):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batches * global_batch, 5, generator=generator)
    y = x @ torch.randn(5, 2, generator=generator) + 0.1
    return [
        (x[i : i + global_batch], y[i : i + global_batch]) for i in range(0, len(x), global_batch)
    ]


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


class Run:
    """A small regression model trained with SGD+momentum on `MirroredStrategy(n replicas)`
    (or `CentralStorageStrategy` over n compute devices)."""

    def __init__(self, replicas: int, data=None, *, central: bool = False):
        if central:
            self.strategy = nd.CentralStorageStrategy(_devices(replicas))
        else:
            self.strategy = nd.MirroredStrategy(_devices(replicas))
        torch.manual_seed(1)
        with self.strategy.scope():
            self.model = torch.nn.Sequential(
                torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
            )
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
            self.seen = nd.Variable(
                0.0, synchronization=nd.VariableSynchronization.ON_READ,
                aggregation=nd.VariableAggregation.SUM,
            )  # fmt: skip
        self.dataset = self.strategy.experimental_distribute_dataset(data or _data())
        self.iterator = iter(self.dataset)

    def step(self, batch) -> None:
        def fn(batch):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.seen.assign_add(float(len(x)))

        self.strategy.run(fn, args=(batch,))

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.step(next(self.iterator))

    def objects(self) -> dict:
        return {
            "model": self.model, "optimizer": self.optimizer, "seen": self.seen,
            "iterator": self.iterator,
        }  # fmt: skip

    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])


# --- round trips -----------------------------------------------------------------------------


def test_plain_objects_round_trip(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    generator = torch.Generator().manual_seed(5)
    tensor, progress, variable = torch.arange(3.0), {"epoch": 4, "best": 0.25}, nd.Variable(2.0)
    path = nd.checkpoint.save(
        tmp_path / "ckpt.pt", model=model, optimizer=optimizer, generator=generator,
        scheduler=scheduler, tensor=tensor, progress=progress, variable=variable,
    )  # fmt: skip
    assert path == str(tmp_path / "ckpt.pt")
    expected_params = [p.detach().clone() for p in model.parameters()]
    expected_draw = torch.rand(3, generator=generator)

    model2 = torch.nn.Linear(3, 2)
    optimizer2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    scheduler2 = torch.optim.lr_scheduler.StepLR(optimizer2, step_size=1, gamma=0.5)
    generator2, tensor2, progress2 = torch.Generator(), torch.zeros(3), {"epoch": 0}
    variable2 = nd.Variable(0.0)
    nd.checkpoint.restore(
        path, model=model2, optimizer=optimizer2, generator=generator2, scheduler=scheduler2,
        tensor=tensor2, progress=progress2, variable=variable2,
    )  # fmt: skip
    for a, b in zip(expected_params, model2.parameters()):
        assert torch.equal(a, b)
    assert optimizer2.state_dict()["state"][0]["exp_avg"].abs().sum() > 0
    assert scheduler2.last_epoch == 1 and optimizer2.param_groups[0]["lr"] == 0.05
    assert torch.equal(torch.rand(3, generator=generator2), expected_draw)
    assert torch.equal(tensor2, torch.arange(3.0))
    assert progress2 == {"epoch": 4, "best": 0.25}
    assert float(variable2) == 2.0


def test_read_returns_the_states_by_name(tmp_path):
    model = torch.nn.Linear(2, 2)
    path = nd.checkpoint.save(tmp_path / "c.pt", model=model, step={"n": 3})
    states = nd.checkpoint.read(path)
    assert set(states) == {"model", "step"}
    assert states["step"] == {"n": 3}
    assert torch.equal(states["model"]["weight"], model.weight.detach())


def test_save_is_atomic_and_owner_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    nd.checkpoint.save(path, w=torch.ones(2))
    assert os.stat(path).st_mode & 0o077 == 0
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]  # no temporary file left


class _UnpicklableTensor(torch.Tensor):
    def __reduce_ex__(self, protocol):
        raise TypeError("this tensor cannot be pickled")


class _Unpicklable:
    def state_dict(self):
        return {"t": torch.zeros(2).as_subclass(_UnpicklableTensor)}

    def load_state_dict(self, state):
        pass


def test_failed_save_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    nd.checkpoint.save(path, w=torch.ones(2))
    before = path.read_bytes()
    with pytest.raises(nd.CheckpointError, match="could not be saved") as info:
        nd.checkpoint.save(path, w=torch.zeros(2), bad=_Unpicklable())
    assert isinstance(info.value.__cause__, (pickle.PicklingError, AttributeError, TypeError))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


# --- replicas --------------------------------------------------------------------------------


def test_sync_on_read_variable_saves_the_aggregate_and_restores_into_other_replicas(tmp_path):
    two = nd.MirroredStrategy(_devices(2))
    with two.scope():
        total = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        mean = nd.Variable(0.0, synchronization="ON_READ", aggregation="MEAN")

    def write():
        replica = nd.get_replica_context().replica_id_in_sync_group
        total.assign(float(replica + 1))  # 1 + 2 = 3 in all
        mean.assign(float(10 * (replica + 1)))  # mean of 10 and 20 = 15

    two.run(write)
    path = nd.checkpoint.save(tmp_path / "v.pt", total=total, mean=mean)
    assert nd.checkpoint.read(path)["total"]["value"].item() == 3.0
    assert nd.checkpoint.read(path)["mean"]["value"].item() == 15.0

    three = nd.MirroredStrategy(_devices(3))
    with three.scope():
        total3 = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        mean3 = nd.Variable(0.0, synchronization="ON_READ", aggregation="MEAN")
    nd.checkpoint.restore(path, total=total3, mean=mean3)
    assert [float(c.value()) for c in total3.values] == pytest.approx([1.0, 1.0, 1.0])
    assert [float(c.value()) for c in mean3.values] == [15.0, 15.0, 15.0]
    assert float(total3.read_value()) == pytest.approx(3.0)


@pytest.mark.parametrize("before", [1, 2, 3, 4])
@pytest.mark.parametrize("after", [1, 2, 3, 4])
def test_integer_sum_sync_on_read_keeps_its_exact_aggregate(tmp_path, before, after):
    # Issue 23: an even split rounded away the remainder (9 saved over 2 replicas read back
    # 8, assign(5) read back 4). Now each replica gets value // N and replica 0 the remainder.
    def counter(strategy):
        with strategy.scope():
            return nd.Variable(0, synchronization="ON_READ", aggregation="SUM", dtype=torch.int64)

    first = nd.MirroredStrategy(_devices(before))
    seen = counter(first)
    first.run(lambda: seen.assign_add(2 * nd.get_replica_context().replica_id_in_sync_group + 3))
    expected = sum(2 * r + 3 for r in range(before))  # 3, 8, 15, 24
    assert int(seen.read_value()) == expected
    path = nd.checkpoint.save(tmp_path / "seen.pt", seen=seen)

    second = nd.MirroredStrategy(_devices(after))
    restored = counter(second)
    nd.checkpoint.restore(path, seen=restored)
    assert restored.read_value().dtype == torch.int64
    assert int(restored.read_value()) == expected
    components = [int(c) for c in second.experimental_local_results(
        second.run(lambda: restored.read_value()))]  # fmt: skip
    assert sum(components) == expected and len(components) == after
    assert components[1:] == [expected // after] * (after - 1)  # the remainder on replica 0
    restored.load_state_dict(seen.state_dict())
    assert int(restored.read_value()) == expected
    for value in (5, -7, 0, 2**40 + 1):
        restored.assign(value)
        assert int(restored.read_value()) == value
    restored.assign(torch.tensor(5.0))  # a float value for an integer variable: still exact
    assert int(restored.read_value()) == 5


def test_integer_sum_sync_on_read_restored_inside_run_keeps_its_total(tmp_path):
    # Inside strategy.run (as a %%distribute cell on engines) each replica restores its share.
    three = nd.MirroredStrategy(_devices(3))
    with three.scope():
        saved = nd.Variable(0, synchronization="ON_READ", aggregation="SUM", dtype=torch.int64)
        restored = nd.Variable(0, synchronization="ON_READ", aggregation="SUM", dtype=torch.int64)
    saved.assign(11)
    path = nd.checkpoint.save(tmp_path / "c.pt", seen=saved)
    three.run(lambda: nd.checkpoint.restore(path, seen=restored))
    assert [int(c.value()) for c in restored.values] == [5, 3, 3]
    assert int(restored.read_value()) == 11


def test_float_sum_sync_on_read_assign_is_still_an_even_split():
    strategy = nd.MirroredStrategy(_devices(2))
    with strategy.scope():
        total = nd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
    total.assign(5.0)
    assert [float(c.value()) for c in total.values] == [2.5, 2.5]


@pytest.mark.parametrize("replicas_after", [2, 3])
def test_resuming_on_other_replicas_continues_like_an_uninterrupted_run(tmp_path, replicas_after):
    uninterrupted = Run(2)
    uninterrupted.train(STEPS)

    first = Run(2)
    first.train(3)
    path = nd.checkpoint.save(tmp_path / "ckpt.pt", **first.objects())
    assert nd.checkpoint.read(path)["iterator"]["batches"] == 3
    assert nd.checkpoint.read(path)["iterator"]["examples"] == 3 * GLOBAL_BATCH

    second = Run(replicas_after)
    nd.checkpoint.restore(path, **second.objects())
    assert float(second.seen.read_value()) == 3 * GLOBAL_BATCH
    second.train(STEPS - 3)
    with pytest.raises(StopIteration):
        next(second.iterator)  # resumed at batch 3: exactly STEPS - 3 batches were left
    assert float(second.seen.read_value()) == STEPS * GLOBAL_BATCH
    assert torch.allclose(second.params(), uninterrupted.params(), atol=1e-6, rtol=0)
    for components in iterate_components(second.strategy._replicas):
        for component in components[1:]:
            assert torch.equal(component, components[0])


def test_central_storage_resumes_on_other_compute_devices(tmp_path):
    uninterrupted = Run(2, central=True)
    uninterrupted.train(STEPS)
    first = Run(2, central=True)
    first.train(3)
    path = nd.checkpoint.save(tmp_path / "ckpt.pt", **first.objects())
    second = Run(3, central=True)
    nd.checkpoint.restore(path, **second.objects())
    second.train(STEPS - 3)
    assert torch.allclose(second.params(), uninterrupted.params(), atol=1e-6, rtol=0)
    assert float(second.seen.read_value()) == STEPS * GLOBAL_BATCH


def test_restoring_an_optimizer_reaches_every_replicas_copy(tmp_path):
    # Replica 1 steps a copy of the optimizer; restoring must replace the copy's momentum too.
    run = Run(2, data=_data(batches=6))
    run.train(2)
    path = nd.checkpoint.save(tmp_path / "ckpt.pt", model=run.model, optimizer=run.optimizer)
    run.train(2)
    expected = run.params()
    nd.checkpoint.restore(path, model=run.model, optimizer=run.optimizer)
    batches = _data(batches=6)
    run.step(next(iter(run.strategy.experimental_distribute_dataset(batches[2:3]))))
    run.step(next(iter(run.strategy.experimental_distribute_dataset(batches[3:4]))))
    assert torch.allclose(run.params(), expected, atol=1e-6, rtol=0)
    for components in iterate_components(run.strategy._replicas):
        assert torch.equal(components[1], components[0])


def test_iterator_of_datasets_from_function_resumes_on_the_same_topology(tmp_path):
    strategy = nd.MirroredStrategy(_devices(2))
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: [torch.full((2,), float(i)) for i in range(6)]
    )
    iterator = iter(dataset)
    next(iterator)
    path = nd.checkpoint.save(tmp_path / "it.pt", iterator=iterator)
    resumed = iter(dataset)
    nd.checkpoint.restore(path, iterator=resumed)
    assert [float(v[0]) for v in next(resumed).values] == [2.0, 3.0]

    other = nd.MirroredStrategy(_devices(3)).distribute_datasets_from_function(
        lambda ctx: [torch.full((2,), float(i)) for i in range(6)]
    )
    with pytest.raises(CheckpointMismatchError, match="only resumes on the same topology"):
        nd.checkpoint.restore(path, iterator=iter(other))


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "pattern"),
    [
        ("afile/ckpt.pt", "is a file, not a directory"),
        ("afile/deeper/ckpt.pt", "is a file, not a directory"),
        (".", "is a directory"),
    ],
)
def test_unwritable_path_is_refused_with_the_fix(tmp_path, where, pattern):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(nd.CheckpointError, match=pattern):
        nd.checkpoint.save(tmp_path / where, w=torch.ones(1))


def test_save_creates_a_missing_directory_as_tf_does(tmp_path):
    # TF's Checkpoint.write/save create the directory of their prefix (recursive_create_dir).
    path = nd.checkpoint.save(tmp_path / "new" / "nested" / "ckpt.pt", w=torch.ones(1))
    assert nd.checkpoint.read(path)["w"].tolist() == [1.0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_directory_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(nd.CheckpointError, match="not writable"):
        nd.checkpoint.save(folder / "ckpt.pt", w=torch.ones(1))


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's sysfs")
def test_a_directory_even_root_cannot_write_is_refused():
    # sysfs refuses new files to every user, root included (unlike a chmod'ed directory).
    with pytest.raises(nd.CheckpointError, match=r"'/sys' is not writable \(Permission denied"):
        nd.checkpoint.save("/sys/nbdist-checkpoint.pt", w=torch.ones(1))


def test_checkpoint_of_another_model_is_refused_and_changes_nothing(tmp_path):
    path = nd.checkpoint.save(tmp_path / "c.pt", model=torch.nn.Linear(4, 3))
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 1))
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(CheckpointMismatchError) as info:
        nd.checkpoint.restore(path, model=other)
    message = str(info.value)
    assert "holds parameters for a model with 2 tensors (15 values)" in message
    assert "has 4 tensors" in message and "0.weight" in message
    assert "restore it into the model it was saved from" in message.lower()
    assert isinstance(info.value, ValueError) and isinstance(info.value, nd.NbdistError)
    for a, b in zip(before, other.parameters()):
        assert torch.equal(a, b)


def test_same_names_other_shapes_are_named(tmp_path):
    path = nd.checkpoint.save(tmp_path / "c.pt", model=torch.nn.Linear(4, 3))
    with pytest.raises(CheckpointMismatchError, match=r"weight \[3, 4\] saved vs \[5, 4\] here"):
        nd.checkpoint.restore(path, model=torch.nn.Linear(4, 5))


def test_optimizer_of_another_model_is_refused_before_anything_changes(tmp_path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    path = nd.checkpoint.save(tmp_path / "c.pt", model=model, optimizer=optimizer)
    target = torch.nn.Linear(4, 3)
    before = target.weight.detach().clone()
    other = torch.optim.SGD(torch.nn.Linear(4, 5).parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointMismatchError, match="optimizer state that does not fit"):
        nd.checkpoint.restore(path, model=target, optimizer=other)
    assert torch.equal(target.weight, before)  # checked before the model was restored
    with pytest.raises(CheckpointMismatchError, match=r"saved from a torch\.optim\.sgd\.SGD"):
        nd.checkpoint.restore(path, optimizer=torch.optim.Adam(target.parameters()))


def test_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "c.pt"
    nd.checkpoint.save(path, model=torch.nn.Linear(64, 64))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    model = torch.nn.Linear(64, 64)
    with pytest.raises(nd.CheckpointError, match="truncated: the file was not completely written"):
        nd.checkpoint.restore(path, model=model)
    with pytest.raises(nd.CheckpointError, match="truncated"):
        nd.checkpoint.read(path)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"", "the file is empty"),
        (b"hello world", "not a torch.save archive"),
    ],
)
def test_files_that_are_not_checkpoints_are_named(tmp_path, content, pattern):
    path = tmp_path / "c.pt"
    path.write_bytes(content)
    with pytest.raises(nd.CheckpointError, match=pattern):
        nd.checkpoint.restore(path, w=torch.zeros(1))


def test_plain_torch_save_file_is_named(tmp_path):
    path = tmp_path / "c.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(nd.CheckpointError, match=r"by torch\.save, not nd\.checkpoint\.save"):
        nd.checkpoint.restore(path, model=torch.nn.Linear(2, 2))


def test_missing_file_and_missing_names(tmp_path):
    with pytest.raises(nd.CheckpointError, match="does not exist"):
        nd.checkpoint.restore(tmp_path / "nope.pt", w=torch.zeros(1))
    path = nd.checkpoint.save(tmp_path / "c.pt", w=torch.zeros(1))
    with pytest.raises(CheckpointMismatchError, match="holds no 'model'; it holds 'w'"):
        nd.checkpoint.restore(path, model=torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointMismatchError, match="as a tensor"):
        nd.checkpoint.restore(path, w=torch.nn.Linear(1, 1))


def test_objects_that_cannot_be_checkpointed(tmp_path):
    strategy = nd.MirroredStrategy(_devices(2))
    dataset = strategy.experimental_distribute_dataset(_data(2))
    with pytest.raises(CheckpointTypeError, match="checkpoint the iterator"):
        nd.checkpoint.save(tmp_path / "c.pt", data=dataset)
    with pytest.raises(CheckpointTypeError, match="keep plain numbers in a dict"):
        nd.checkpoint.save(tmp_path / "c.pt", epoch=3)
    with pytest.raises(CheckpointTypeError, match=r"progress\['best'\] is a numpy\.float64"):
        nd.checkpoint.save(tmp_path / "c.pt", progress={"epoch": 1, "best": np.float64(0.5)})
    with pytest.raises(CheckpointTypeError, match=r"fn\['f'\] is a builtins\.function"):
        nd.checkpoint.save(tmp_path / "c.pt", fn={"f": lambda: 0})
    with pytest.raises(CheckpointTypeError, match="no objects"):
        nd.checkpoint.save(tmp_path / "c.pt")
    with pytest.raises(CheckpointTypeError, match="file path first"):
        nd.checkpoint.save(torch.nn.Linear(1, 1))
    assert not os.listdir(tmp_path)


def test_saving_from_every_replica_writes_one_consistent_checkpoint(tmp_path, monkeypatch):
    import nbdist.checkpoint.save_restore as save_restore

    writes = []
    real = save_restore.write_atomic
    monkeypatch.setattr(save_restore, "write_atomic", lambda *a: (writes.append(1), real(*a)))
    run = Run(3)
    run.train(2)
    path = str(tmp_path / "c.pt")
    progress = {"epoch": 1}
    saved = run.strategy.run(
        lambda: nd.checkpoint.save(path, model=run.model, seen=run.seen, progress=progress)
    )
    assert saved == path and len(writes) == 1
    assert nd.checkpoint.read(path)["seen"]["value"].item() == 2 * GLOBAL_BATCH  # aggregated
    expected = run.params()
    run.train(1)
    progress["epoch"] = 5
    run.strategy.run(lambda: nd.checkpoint.restore(path, model=run.model, progress=progress))
    assert torch.equal(run.params(), expected) and progress == {"epoch": 1}
    for components in iterate_components(run.strategy._replicas):  # restored on every replica
        assert all(torch.equal(c, components[0]) for c in components[1:])
    with pytest.raises(nd.CheckpointError, match="different paths or objects on different"):
        run.strategy.run(
            lambda: nd.checkpoint.save(
                str(tmp_path / f"c{nd.get_replica_context().replica_id_in_sync_group}.pt"),
                model=run.model,
            )
        )


def test_iterator_position_must_fit(tmp_path):
    run = Run(2)
    run.train(5)
    path = nd.checkpoint.save(tmp_path / "c.pt", iterator=run.iterator)
    short = Run(2, data=_data(batches=3))
    with pytest.raises(CheckpointMismatchError, match="has only 3 batches"):
        nd.checkpoint.restore(path, iterator=short.iterator)
    other_batch = Run(2, data=_data(batches=STEPS, global_batch=8))
    with pytest.raises(CheckpointMismatchError, match="global batch size differs"):
        nd.checkpoint.restore(path, iterator=other_batch.iterator)
    started = Run(2)
    started.train(1)
    with pytest.raises(nd.CheckpointError, match="fresh iter"):
        nd.checkpoint.restore(path, iterator=started.iterator)


def test_a_sharded_dataloader_skips_by_index_and_resumes_on_other_workers():
    from torch.utils.data import DataLoader, TensorDataset

    from nbdist.input import distribute_dataset

    class Counting(TensorDataset):
        reads = 0

        def __getitem__(self, index):
            Counting.reads += 1
            return super().__getitem__(index)

    rows = torch.arange(48.0).reshape(48, 1)

    def worker(index, workers, data=rows):
        loader = DataLoader(Counting(data), batch_size=12, shuffle=True,
                            generator=torch.Generator().manual_seed(3))  # fmt: skip
        dataset = distribute_dataset(
            loader, devices=("cpu:0",), num_replicas_in_sync=workers, num_workers=workers,
            worker_index=index,
        )  # fmt: skip
        return iter(dataset)

    saved_on_two = worker(0, 2)
    taken = [next(saved_on_two) for _ in range(2)]
    state = saved_on_two.state_dict()
    assert (state["batches"], state["examples"]) == (2, 24)
    reference = [batch for batch in worker(0, 1)]  # the global batches, on one worker
    assert torch.equal(taken[1][0], reference[1][0][:6])  # worker 0 of 2: the first half
    Counting.reads = 0
    resumed = [worker(index, 3) for index in range(3)]
    for iterator in resumed:
        iterator.load_state_dict(state)
    assert Counting.reads == 3 * 4  # skipped batches were not read: only the next step's rows
    rest = [[next(it)[0] for it in resumed] for _ in range(2)]
    for step, parts in enumerate(rest, start=2):
        assert torch.equal(torch.cat(parts), reference[step][0])
    with pytest.raises(CheckpointMismatchError, match="has only 1 batches"):
        worker(0, 3, data=rows[:12]).load_state_dict(state)


def test_workers_positions_that_differ_are_named_with_the_fix():
    # The decision nd.checkpoint.save takes on every worker from the gathered positions
    # (tests/dist/test_checkpoint_workers.py runs it across real workers).
    from nbdist.checkpoint.workers import position_disagreement

    assert position_disagreement(["a", "b"], [[3, 24, 1, -1], [3, 24, 1, -1]]) is None
    message = position_disagreement(["a", "b"], [[3, 24, 2, -1], [3, 24, 1, -1], [3, 24, 2, -1]])
    assert message is not None
    assert message.startswith("the distributed iterator 'b' is at different positions")
    assert "(worker 0: 2 batches, worker 1: 1 batches, worker 2: 2 batches)" in message
    assert "worker(s) [1] would skip their share" in message
    assert "Save at a step boundary where every worker has taken the same number" in message
