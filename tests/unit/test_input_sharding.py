"""nbdist.input with several workers: a map-style DataLoader is sharded by index, each worker
reading only its replicas' rows of every global batch (workers simulated in one process)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
)

from nbdist.core.values import PerReplica
from nbdist.errors import NbdistError
from nbdist.input import distribute_dataset, split_batch
from nbdist.input.sharding import WorkerBatchSampler, shard_loader


class RecordingDataset(Dataset):
    """A map-style dataset of rows `(features[i], i)` that records every index it is asked for.

    In worker processes the records stay there; with `log_dir`, each process also appends the
    indices it reads to `log_dir/<pid>` so that the test can collect them.
    """

    def __init__(self, size: int, log_dir=None):
        self.features = torch.arange(size * 3, dtype=torch.float32).reshape(size, 3)
        self.reads: list[int] = []
        self.log_dir = log_dir

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int):
        self.reads.append(int(index))
        if self.log_dir is not None:
            with open(os.path.join(self.log_dir, str(os.getpid())), "a") as log:
                log.write(f"{int(index)}\n")
        return self.features[index], torch.tensor(index)


class StreamDataset(IterableDataset):
    def __init__(self, size: int):
        self.size = size

    def __iter__(self):
        return iter(torch.arange(self.size))


def worker_dataset(loader_fn, worker, per_worker=1, workers=2):
    """Worker `worker`'s distributed dataset over its own loader (as in its own process)."""
    devices = [f"cpu:{i}" for i in range(per_worker)]
    return distribute_dataset(
        loader_fn(),
        devices=devices,
        num_replicas_in_sync=per_worker * workers,
        num_workers=workers,
        worker_index=worker,
    )


def parts(structure, index=1) -> list[torch.Tensor]:
    """The per-replica tensors of leaf `index` (1: the row ids) of one step."""
    leaf = structure[index]
    return list(leaf.values) if isinstance(leaf, PerReplica) else [leaf]


def run_workers(loader_fn, per_worker=1, workers=2):
    """Per worker: its reads (indices) and per step its replicas' row ids."""
    out = []
    for worker in range(workers):
        loader = loader_fn()
        data = loader.dataset
        ds = worker_dataset(lambda loader=loader: loader, worker, per_worker, workers)
        steps = [[p.tolist() for p in parts(step)] for step in ds]
        out.append((list(data.reads), steps, ds))
    return out


def plain_loader(size=20, **kwargs):
    kwargs.setdefault("batch_size", 8)
    return lambda: DataLoader(RecordingDataset(size), **kwargs)


# --- who reads what -----------------------------------------------------------------------------


def test_each_worker_reads_only_its_half_of_every_global_batch():
    (reads0, steps0, ds0), (reads1, steps1, ds1) = run_workers(plain_loader())
    assert reads0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17]
    assert reads1 == [4, 5, 6, 7, 12, 13, 14, 15, 18, 19]
    assert steps0 == [[[0, 1, 2, 3]], [[8, 9, 10, 11]], [[16, 17]]]
    assert steps1 == [[[4, 5, 6, 7]], [[12, 13, 14, 15]], [[18, 19]]]  # last batch 4: 2 | 2
    assert sorted(reads0 + reads1) == list(range(20))  # every element read exactly once
    assert len(ds0) == len(ds1) == 3 == len(plain_loader()())


def test_rows_match_their_indices():
    ds = worker_dataset(plain_loader(), worker=1)
    data = ds._source.dataset
    for features, ids in ds:
        assert torch.equal(features, data.features[ids])


def test_drop_last_is_respected():
    loader_fn = plain_loader(drop_last=True)
    (reads0, steps0, ds0), (reads1, steps1, ds1) = run_workers(loader_fn)
    assert sorted(reads0 + reads1) == list(range(16))
    assert len(steps0) == len(steps1) == len(ds0) == len(ds1) == len(loader_fn()) == 2


def test_two_epochs_read_the_same_shares_again():
    ds = worker_dataset(plain_loader(), worker=0)
    first = [parts(step)[0].tolist() for step in ds]
    second = [parts(step)[0].tolist() for step in ds]
    assert first == second == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17]]
    assert ds._source.dataset.reads == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17] * 2


def test_shuffle_with_a_seeded_generator_gives_every_worker_the_same_global_batches():
    def loader_fn():
        return DataLoader(
            RecordingDataset(20),
            batch_size=8,
            shuffle=True,
            generator=torch.Generator().manual_seed(1234),
        )

    workers = [worker_dataset(loader_fn, worker) for worker in (0, 1)]
    reference = loader_fn()  # the original loader, same seed
    for _ in range(2):  # the generator advances the same way on every worker, epoch after epoch
        expected = [ids.tolist() for _, ids in reference]
        steps = [[parts(step)[0].tolist() for step in ds] for ds in workers]
        assert [a + b for a, b in zip(*steps)] == expected
        assert expected != [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    reads = [ds._source.dataset.reads for ds in workers]
    assert sorted(reads[0][:10] + reads[1][:10]) == list(range(20))
    assert not set(reads[0][:10]) & set(reads[1][:10])


def test_shuffle_without_a_generator_is_refused_with_the_fix():
    loader = DataLoader(RecordingDataset(20), batch_size=8, shuffle=True)
    with pytest.raises(
        ValueError, match=r"generator=torch\.Generator\(\)\.manual_seed\(SEED\)"
    ) as e:
        distribute_dataset(loader, devices=["cpu:0"], num_replicas_in_sync=2, num_workers=2)
    assert isinstance(e.value, NbdistError)
    # One worker reads every batch itself: nothing to agree on.
    assert len(list(distribute_dataset(loader, devices=["cpu:0"], num_replicas_in_sync=1))) == 3


def test_a_random_sampler_inside_a_custom_batch_sampler_is_checked_too():
    data = RecordingDataset(20)
    sampler = BatchSampler(torch.utils.data.RandomSampler(data), 8, False)
    with pytest.raises(ValueError, match="without a generator"):
        distribute_dataset(
            DataLoader(data, batch_sampler=sampler),
            devices=["cpu:0"],
            num_replicas_in_sync=2,
            num_workers=2,
        )


# --- several local replicas, uneven and empty shares -------------------------------------------


def test_two_local_replicas_per_worker_follow_the_global_split():
    (reads0, steps0, _), (reads1, steps1, _) = run_workers(plain_loader(), per_worker=2)
    assert steps0 == [[[0, 1], [2, 3]], [[8, 9], [10, 11]], [[16], [17]]]
    assert steps1 == [[[4, 5], [6, 7]], [[12, 13], [14, 15]], [[18], [19]]]
    assert reads0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17]
    assert sorted(reads0 + reads1) == list(range(20))


@pytest.mark.parametrize("size, batch_size", [(10, 10), (5, 8), (17, 8), (13, 6), (30, 8)])
@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # by design
def test_every_replica_gets_its_tensorflow_slice_and_reads_only_it(size, batch_size):
    per_worker, workers = 2, 3
    total = per_worker * workers
    results = run_workers(plain_loader(size, batch_size=batch_size), per_worker, workers)
    starts = list(range(0, size, batch_size))
    for worker, (reads, steps, ds) in enumerate(results):
        assert len(steps) == len(ds) == len(starts)
        mine = []
        for step, start in zip(steps, starts):
            bounds = split_batch(min(batch_size, size - start), total)
            for local, rows in enumerate(step):
                lo, hi = bounds[worker * per_worker + local]
                assert rows == list(range(start + lo, start + hi))
                mine += rows
        # A worker without any row all epoch reads row 0 once, for the structure.
        assert reads == (mine or [0])


@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # by design
def test_a_worker_without_rows_in_its_first_batch_reads_only_its_rows():
    # Batches of 8 and 12 over 6 replicas: 2 2 2 2 0 0, then 2 each; worker 2 (replicas 4, 5)
    # starts with an empty step, shaped like the rows it reads later.
    def loader_fn():
        return DataLoader(RecordingDataset(20), batch_sampler=[range(8), range(8, 20)])

    reads, steps, ds = run_workers(loader_fn, per_worker=2, workers=3)[2]
    assert steps == [[[], []], [[16, 17], [18, 19]]]
    assert reads == [16, 17, 18, 19]
    features, _ = next(iter(ds))
    assert [part.shape for part in features.values] == [(0, 3), (0, 3)]


@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # by design
def test_a_worker_without_rows_gets_empty_slices_shaped_like_the_data_without_reading():
    # 17 rows in batches of 8: the last batch (1 row) goes to global replica 0 only.
    (_, steps0, _), (reads1, steps1, ds1) = run_workers(plain_loader(17), per_worker=2)
    assert steps0[-1] == [[16], []]
    assert steps1[-1] == [[], []] and 16 not in reads1
    features, ids = list(ds1)[-1]
    for part in features.values:
        assert part.shape == (0, 3) and part.dtype == torch.float32
    for part in ids.values:
        assert part.shape == (0,) and part.dtype == torch.int64


@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # by design
def test_a_worker_without_rows_in_its_first_batch_probes_one_row():
    # 1 row over 2 workers: worker 1 has nothing to read at all; it reads the batch's first row
    # once to learn the structure, and hands out 0 rows of it.
    (reads0, steps0, _), (reads1, steps1, ds1) = run_workers(plain_loader(1))
    assert steps0 == [[[0]]] and reads0 == [0]
    assert steps1 == [[[]]] and reads1 == [0]
    features, ids = next(iter(ds1))
    assert features.shape == (0, 3) and ids.shape == (0,)


@pytest.mark.filterwarnings("ignore::nbdist.input.batches.EmptyReplicaBatchWarning")  # by design
def test_worker_batch_sampler_records_what_it_did():
    sampler = WorkerBatchSampler(BatchSampler(SequentialSampler(range(9)), 4, False), (1,), 2)
    assert len(sampler) == 3
    assert list(sampler) == [[2, 3], [6, 7]]
    assert list(sampler.record) == [("read", (2,)), ("read", (2,)), ("skip", (0,))]


# --- the loader's settings ----------------------------------------------------------------------


def _init(worker_id):  # a worker_init_fn
    pass


def collate_dict(samples):
    return {"x": torch.stack([s[0] for s in samples]), "id": torch.stack([s[1] for s in samples])}


def test_the_worker_loader_keeps_the_original_settings():
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        RecordingDataset(20),
        batch_size=8,
        shuffle=True,
        generator=generator,
        num_workers=2,
        collate_fn=collate_dict,
        pin_memory=False,
        timeout=30,
        worker_init_fn=_init,
        prefetch_factor=3,
        persistent_workers=True,
    )
    sharded = shard_loader(loader, (2, 3), 4, 2)
    new = sharded.loader
    assert new.dataset is loader.dataset and new.batch_sampler.batch_sampler is loader.batch_sampler
    for name in (
        "num_workers",
        "collate_fn",
        "pin_memory",
        "timeout",
        "worker_init_fn",
        "generator",
        "prefetch_factor",
        "persistent_workers",
        "multiprocessing_context",
    ):
        assert getattr(new, name) == getattr(loader, name), name


def test_subprocess_loading_reads_only_this_workers_rows(tmp_path):
    steps, reads = [], []
    for worker in (0, 1):
        log_dir = tmp_path / str(worker)
        log_dir.mkdir()

        def loader_fn(log_dir=log_dir):
            return DataLoader(
                RecordingDataset(20, log_dir=str(log_dir)),
                batch_size=8,
                num_workers=2,
                persistent_workers=True,
                collate_fn=collate_dict,
            )

        ds = worker_dataset(loader_fn, worker, per_worker=2)
        epochs = [[[p.tolist() for p in step["id"].values] for step in ds] for _ in range(2)]
        assert epochs[0] == epochs[1]
        steps.append(epochs[0])
        logs = list(log_dir.iterdir())
        assert len(logs) == 2 and str(os.getpid()) not in {p.name for p in logs}
        reads.append(sorted(int(i) for p in logs for i in p.read_text().split()))
    assert steps[0] == [[[0, 1], [2, 3]], [[8, 9], [10, 11]], [[16], [17]]]
    assert steps[1] == [[[4, 5], [6, 7]], [[12, 13], [14, 15]], [[18], [19]]]
    assert reads[0] == sorted([0, 1, 2, 3, 8, 9, 10, 11, 16, 17] * 2)  # two epochs
    assert sorted(reads[0] + reads[1]) == sorted(list(range(20)) * 2)


# --- what is not sharded, and what is refused ---------------------------------------------------


class MyLoader(DataLoader):
    pass


class Chunks(Dataset):
    """Items that are batches already: rows 4i..4i+3 of `data`."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data) // 4

    def __getitem__(self, i):
        return torch.stack([self.data[j][1] for j in range(4 * i, 4 * i + 4)])


@pytest.mark.parametrize(
    "make",
    [
        lambda data: MyLoader(data, batch_size=8),  # a subclass may iterate differently
        lambda data: DataLoader(Chunks(data), batch_size=None),  # no batch sampler
        lambda data: [torch.arange(8), torch.arange(8, 12)],  # not a DataLoader
    ],
    ids=["subclass", "unbatched", "list"],
)
def test_other_inputs_are_read_whole_on_every_worker(make):
    data = RecordingDataset(12)
    source = make(data)
    assert shard_loader(source, (1,), 2, 2) is None
    ds = distribute_dataset(
        source, devices=["cpu:0"], num_replicas_in_sync=2, num_workers=2, worker_index=1
    )
    list(ds)
    if not isinstance(source, list):
        assert sorted(data.reads) == list(range(12))


def test_iterable_dataset_is_read_whole():
    loader = DataLoader(StreamDataset(10), batch_size=4)
    assert shard_loader(loader, (1,), 2, 2) is None
    ds = distribute_dataset(
        loader, devices=["cpu:0"], num_replicas_in_sync=2, num_workers=2, worker_index=1
    )
    assert [x.tolist() for x in ds] == [[2, 3], [6, 7], [9]]


def test_one_worker_is_not_sharded():
    assert shard_loader(plain_loader()(), (0, 1), 2, 1) is None


def test_distributed_sampler_is_refused():
    data = RecordingDataset(20)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(ValueError, match="DistributedSampler"):
        distribute_dataset(
            DataLoader(data, batch_size=8, sampler=sampler),
            devices=["cpu:0"],
            num_replicas_in_sync=2,
            num_workers=2,
        )


@pytest.mark.skipif(not hasattr(DataLoader(range(1)), "in_order"), reason="torch < 2.6")
def test_out_of_order_loading_is_refused():
    loader = DataLoader(RecordingDataset(20), batch_size=8, num_workers=2, in_order=False)
    with pytest.raises(ValueError, match="in_order=False"):
        distribute_dataset(loader, devices=["cpu:0"], num_replicas_in_sync=2, num_workers=2)


def test_a_collate_fn_that_changes_the_row_count_is_an_error():
    loader = DataLoader(
        RecordingDataset(20), batch_size=8, collate_fn=lambda samples: torch.zeros(len(samples) + 1)
    )
    ds = distribute_dataset(loader, devices=["cpu:0"], num_replicas_in_sync=2, num_workers=2)
    with pytest.raises(ValueError, match="one row per index"):
        next(iter(ds))
