"""ParameterServerStrategy's rules with its tasks served from this process (2 ps tasks and
one worker, `nd.Server` threads): placement, partitioners, shards, the coordinator's error
rules and every bad input of issue 11."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import nbdist as nd
from nbdist.experimental.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
)
from nbdist.testing.ports import free_ports


@pytest.fixture(scope="module")
def spec():
    ports = free_ports(3)
    spec = nd.ClusterSpec(
        {
            "worker": [f"127.0.0.1:{ports[0]}"],
            "ps": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
        }
    )
    servers = [nd.Server(spec, "ps", 0), nd.Server(spec, "ps", 1), nd.Server(spec, "worker", 0)]
    yield spec
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def coordinated(spec):
    strategy = nd.ParameterServerStrategy(spec)
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    yield strategy, coordinator
    coordinator.shutdown()
    strategy.close()


# -- partitioners: TF's shard counts -------------------------------------------------------
@pytest.mark.parametrize(
    "partitioner, shape, dtype, expected",
    [
        (FixedShardsPartitioner(4), [10, 3], torch.float32, [4, 1]),
        (FixedShardsPartitioner(4), [2, 3], torch.float32, [2, 1]),
        (FixedShardsPartitioner(3), [7], torch.int64, [3]),
        (MinSizePartitioner(), [1024, 256], torch.float32, [1, 1]),
        (MinSizePartitioner(max_shards=4), [1024, 256], torch.float32, [4, 1]),
        (MinSizePartitioner(max_shards=4), [10, 8], torch.float32, [1, 1]),
        (MinSizePartitioner(max_shards=4), [3, 100000], torch.float32, [3, 1]),
        (MinSizePartitioner(min_shard_bytes=64, max_shards=8), [10, 4], torch.float32, [3, 1]),
        (MinSizePartitioner(min_shard_bytes=64, max_shards=8), [10, 4], torch.float64, [5, 1]),
        (MaxSizePartitioner(1024), [100, 8], torch.float32, [4, 1]),
        (MaxSizePartitioner(1024), [10, 1000], torch.float32, [10, 1]),
        (MaxSizePartitioner(1024, max_shards=3), [10, 1000], torch.float32, [3, 1]),
        (MaxSizePartitioner(1024), [64], torch.int64, [1]),
        (MaxSizePartitioner(48), [10, 4], torch.float32, [4, 1]),
        (MaxSizePartitioner(8, max_shards=3), [10, 1], torch.float32, [3, 1]),
    ],
)
def test_partitioners_give_tfs_shard_counts(partitioner, shape, dtype, expected):
    assert partitioner(torch.Size(shape), dtype) == expected


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: FixedShardsPartitioner(0), "num_shards"),
        (lambda: MinSizePartitioner(min_shard_bytes=0), "min_shard_bytes"),
        (lambda: MinSizePartitioner(max_shards=0), "max_shards"),
        (lambda: MinSizePartitioner(bytes_per_string=0), "bytes_per_string"),
        (lambda: MaxSizePartitioner(0), "max_shard_bytes"),
        (lambda: MaxSizePartitioner(10, max_shards=-1), "max_shards"),
        (lambda: MaxSizePartitioner(10, bytes_per_string=0), "bytes_per_string"),
    ],
)
def test_partitioner_arguments_below_one_are_value_errors(make, name):
    with pytest.raises(ValueError, match=f"`{name}` must be at least 1"):
        make()


# -- placement --------------------------------------------------------------------------------
def test_ten_rows_in_four_fixed_shards_alternate_over_two_ps(spec):
    strategy = nd.ParameterServerStrategy(spec, variable_partitioner=FixedShardsPartitioner(4))
    try:
        with strategy.scope():
            table = nd.Variable(torch.arange(20.0).reshape(10, 2), name="emb")
        shards = table.variables
        assert [s.shape[0] for s in shards] == [3, 3, 2, 2]
        assert [s.name for s in shards] == [f"emb/part_{i}" for i in range(4)]
        assert [s.device for s in shards] == [
            f"/job:ps/replica:0/task:{i % 2}/device:CPU:0" for i in range(4)
        ]
        assert torch.equal(shards[1].read_value(), torch.arange(6.0, 12.0).reshape(3, 2))
        assert torch.equal(table.read_value(), torch.arange(20.0).reshape(10, 2))
        table.assign_add(torch.ones(10, 2))
        assert torch.equal(table.read_value(), torch.arange(20.0).reshape(10, 2) + 1)
    finally:
        strategy.close()


def test_variables_and_parameters_go_round_robin(spec):
    strategy = nd.ParameterServerStrategy(spec)
    try:
        with strategy.scope():
            a = nd.Variable(1.0, name="a")
            layer = torch.nn.Linear(3, 2)  # weight then bias
            b = nd.Variable(torch.zeros(2), name="b")
        assert a.variables[0].device.endswith("task:0/device:CPU:0")
        assert [strategy.placement(p)[0].ps for p in (layer.weight, layer.bias)] == [1, 0]
        assert b.variables[0].ps == 1
        assert a.read_value() == 1.0  # rank 0: never split
        with pytest.raises(nd.errors.ContextError, match=r"coordinator\.schedule"):
            strategy.run(lambda: 1)
    finally:
        strategy.close()


@pytest.mark.parametrize("answer", [[2], [2, 2], [0, 1], "2,1", [2.5, 1], None, lambda: 1])
def test_a_partitioner_answering_other_than_k_1_is_a_value_error(spec, answer):
    strategy = nd.ParameterServerStrategy(spec, variable_partitioner=lambda shape, dtype: answer)
    try:
        with pytest.raises(ValueError, match=r"must return a list \[k, 1, \.\.\., 1\]"):
            with strategy.scope():
                nd.Variable(torch.zeros(4, 3), name="t")
    finally:
        strategy.close()


# -- clusters that cannot work ------------------------------------------------------------------
@pytest.mark.parametrize(
    "cluster, missing",
    [
        ({"worker": ["127.0.0.1:1"]}, "ps"),
        ({"ps": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"]}, "worker"),
    ],
)
def test_a_cluster_without_ps_or_worker_is_refused(cluster, missing):
    with pytest.raises(ValueError, match=f"no '{missing}' task.*nd.Cluster"):
        nd.ParameterServerStrategy(
            nd.cluster_resolver.SimpleClusterResolver(nd.ClusterSpec(cluster))
        )


def test_a_partitioner_that_is_not_callable_is_refused(spec):
    with pytest.raises(TypeError, match="FixedShardsPartitioner"):
        nd.ParameterServerStrategy(spec, variable_partitioner=4)


# -- the coordinator ---------------------------------------------------------------------------
def _add_one(v):
    v.assign_add(torch.ones(v.shape))
    return v.read_value()


def _fails(v):
    raise KeyError("no such row")


def _take(iterator):
    return next(iterator)


def test_schedule_runs_functions_and_updates_the_ps(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        v = nd.Variable(torch.zeros(4), name="v")
    values = [coordinator.schedule(_add_one, args=(v,)) for _ in range(5)]
    coordinator.join()
    assert coordinator.done()
    assert torch.equal(v.read_value(), torch.full((4,), 5.0))
    assert values[-1].fetch().tolist() and isinstance(values[-1].get(), torch.Tensor)
    assert coordinator.fetch({"x": values[0]})["x"].shape == (4,)


def test_an_error_reraises_from_fetch_and_once_from_join(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        v = nd.Variable(torch.zeros(2), name="w")
    failed = coordinator.schedule(_fails, args=(v,))
    with pytest.raises(KeyError, match=r"no such row.*'_fails' failed on /job:worker/task:0"):
        failed.fetch()
    with pytest.raises(KeyError, match="no such row"):
        coordinator.join()
    coordinator.join()  # raised once, then cleared
    assert coordinator.done()


def test_queued_functions_are_cancelled_after_an_error(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        v = nd.Variable(torch.zeros(2), name="c")
    values = [coordinator.schedule(_fails, args=(v,))]
    values += [coordinator.schedule(_add_one, args=(v,)) for _ in range(20)]
    with pytest.raises(KeyError):
        coordinator.join()
    cancelled = []
    for value in values[1:]:
        try:
            value.get()
        except nd.errors.CancelledError as error:
            cancelled.append(str(error))
    assert cancelled, "no queued function was cancelled"
    assert "schedule it again" in cancelled[0]
    coordinator.join()


def test_bad_arguments_to_schedule(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        v = nd.Variable(torch.zeros(2), name="d")
    value = coordinator.schedule(_add_one, args=(v,))
    with pytest.raises(ValueError, match=r"RemoteValue as args\[0\].*fetch"):
        coordinator.schedule(_add_one, args=(value,))
    with pytest.raises(ValueError, match="RemoteValue"):
        coordinator.schedule(_add_one, args=([value],))
    with pytest.raises(TypeError, match=r"cannot send args\[1\] of '_add_one'.*pickled"):
        coordinator.schedule(_add_one, args=(v, threading.Lock()))
    with pytest.raises(TypeError, match="function to call"):
        coordinator.schedule(42)
    coordinator.join()


def test_per_worker_iterators_work_on_workers_only(coordinated):
    _, coordinator = coordinated
    dataset = coordinator.create_per_worker_dataset(lambda: iter(range(100)))
    iterator = iter(dataset)
    assert [coordinator.schedule(_take, args=(iterator,)).fetch() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TypeError, match=r"next\(\) of a per-worker iterator.*schedule"):
        next(iterator)
    with pytest.raises(TypeError, match="function returning a dataset"):
        coordinator.create_per_worker_dataset([1, 2])


def test_the_coordinator_needs_a_parameter_server_strategy():
    with pytest.raises(TypeError, match="ParameterServerStrategy"):
        nd.experimental.coordinator.ClusterCoordinator(nd.OneDeviceStrategy("cpu"))


def test_server_refuses_bad_tasks(spec):
    with pytest.raises(ValueError, match="'ps' or 'worker'"):
        nd.Server(spec, "chief", 0)
    with pytest.raises(ValueError, match="task_index=5"):
        nd.Server(spec, "worker", 5, start=False)
    server = nd.Server(spec, "worker", 0, start=False)
    assert server.target.startswith("nbdist://127.0.0.1:")


def test_public_names():
    assert nd.experimental.ParameterServerStrategy is nd.ParameterServerStrategy
    assert issubclass(nd.errors.PSUnavailableError, nd.NbdistError)
    assert issubclass(nd.errors.CancelledError, nd.NbdistError)
    assert nd.PSUnavailableError is nd.errors.PSUnavailableError


# -- sharded variables in scheduled functions, and the error raised from schedule / done -------
@pytest.fixture(scope="module")
def sharded(spec):
    """A second worker task (its own chief connection) and a strategy splitting every variable
    into 4 shards over the same 2 ps tasks."""
    (port,) = free_ports(1)
    cluster = {"worker": [f"127.0.0.1:{port}"], "ps": spec.job_tasks("ps")}
    server = nd.Server(nd.ClusterSpec(cluster), "worker", 0)
    strategy = nd.ParameterServerStrategy(
        nd.ClusterSpec(cluster), variable_partitioner=FixedShardsPartitioner(4)
    )
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    yield strategy, coordinator
    coordinator.shutdown()
    strategy.close()
    server.stop()


def _whole_then_add(table):
    seen = table.read_value().clone()
    table.assign_add(torch.arange(table.shape[0], dtype=torch.float32)[:, None])
    return seen


def test_a_function_reads_a_sharded_variable_whole_and_updates_every_shard(sharded):
    strategy, coordinator = sharded
    with strategy.scope():
        table = nd.Variable(torch.arange(20.0).reshape(10, 2), name="table")
    assert [s.shape[0] for s in table.variables] == [3, 3, 2, 2]
    seen = coordinator.schedule(_whole_then_add, args=(table,)).get()
    assert torch.equal(seen, torch.arange(20.0).reshape(10, 2))
    expected = torch.arange(20.0).reshape(10, 2) + torch.arange(10.0)[:, None]
    assert torch.equal(table.read_value(), expected)
    assert torch.equal(table.variables[3].read_value(), expected[8:])


def test_the_first_error_is_raised_once_from_schedule_and_from_done(sharded):
    strategy, coordinator = sharded
    with strategy.scope():
        v = nd.Variable(torch.zeros(2), name="e")
    failed = coordinator.schedule(_fails, args=(v,))
    with pytest.raises(KeyError):
        failed.get()  # finished: the coordinator holds its error (set under the same lock)
    with pytest.raises(KeyError, match=r"no such row.*/job:worker/task:0"):
        coordinator.schedule(_add_one, args=(v,))
    coordinator.join()  # the error was raised once: nothing more to raise
    assert torch.equal(v.read_value(), torch.zeros(2)), "the refused schedule ran"

    failed = coordinator.schedule(_fails, args=(v,))
    with pytest.raises(KeyError):
        failed.get()
    with pytest.raises(KeyError, match="no such row"):
        coordinator.done()
    assert coordinator.done()


def test_a_function_that_cannot_be_pickled_names_the_fix(sharded):
    _, coordinator = sharded
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot send the function of '<lambda>'.*inside the"):
        coordinator.schedule(lambda: lock.locked())


def test_schedule_after_shutdown_is_refused_instead_of_hanging(coordinated):
    strategy, _ = coordinated
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    coordinator.shutdown()
    with pytest.raises(RuntimeError, match=r"shut down.*ClusterCoordinator\(strategy\)"):
        coordinator.schedule(_take, args=(None,))
    coordinator.join()  # nothing queued: returns at once


# -- the transport: small tensors packed together, large ones alone, into reused buffers ------
def test_a_ps_task_returns_every_dtype_and_size_exactly():
    from nbdist.strategies.parameter_server.ps_task import PSTask
    from nbdist.strategies.parameter_server.transport import PSClient

    task = PSTask("127.0.0.1", 0).start()
    client = PSClient(0, f"127.0.0.1:{task.port}", timeout=60)
    try:
        values = {
            1: torch.tensor(True),
            2: torch.tensor(7, dtype=torch.int64),
            3: torch.arange(3, dtype=torch.float16),  # 6 bytes: the next one is not aligned
            4: torch.randn(5, 3, dtype=torch.complex64),
            5: torch.zeros(0, 4),
            6: torch.randn(300_000),  # 1.2 MB: sent on its own
            7: torch.randint(0, 255, (33,), dtype=torch.uint8),
            8: torch.randn(64, 65).t(),  # not contiguous
        }
        client.create(values)
        ids = list(values)
        read = client.read(ids)
        for i, tensor in zip(ids, read):
            assert tensor.dtype == values[i].dtype and torch.equal(tensor, values[i]), i
        into = [torch.empty_like(t) if i != 3 else torch.empty(2) for i, t in zip(ids, read)]
        again = client.read(ids, into=into)
        for i, tensor, buffer in zip(ids, again, into):
            assert torch.equal(tensor, values[i]), i
            reused = tensor.data_ptr() == buffer.data_ptr()
            assert reused == (i != 3), i  # the wrong shape: a new tensor instead
        client.add({2: torch.tensor(1), 6: torch.ones(300_000)})
        two, six = client.read([2, 6])
        assert int(two) == 8 and torch.equal(six, values[6] + 1)
    finally:
        client.close()
        task.stop()


def test_a_client_killed_before_announcing_its_session_does_not_block_later_clients():
    """Note [Sessions out of order]: a session number taken and never announced (its client
    died in between) must not keep the ps task from serving the clients after it."""
    from nbdist.strategies.parameter_server.ps_task import PSTask
    from nbdist.strategies.parameter_server.transport import SESSIONS, PSClient, connect_store

    task = PSTask("127.0.0.1", 0).start()
    address = f"127.0.0.1:{task.port}"
    connect_store(address, 30).add(SESSIONS, 1)  # what the killed client got done
    client = PSClient(0, address, timeout=30)
    try:
        client.create({1: torch.arange(4.0)})
        assert torch.equal(client.read([1])[0], torch.arange(4.0))
        assert task.sessions == 1
    finally:
        client.close()
        task.stop()


def test_join_raises_when_no_worker_is_reachable_within_the_timeout(spec):
    (port,) = free_ports(1)  # nothing listens there: the worker task was never started
    cluster = nd.ClusterSpec({"worker": [f"127.0.0.1:{port}"], "ps": spec.job_tasks("ps")})
    strategy = nd.ParameterServerStrategy(cluster)
    strategy.timeout = 1.0
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    try:
        value = coordinator.schedule(_take, args=(None,))
        started = time.monotonic()
        with pytest.raises(
            nd.errors.WorkerLostError, match=rf"No worker.*127.0.0.1:{port}.*nd\.Server"
        ):
            coordinator.join()
        assert time.monotonic() - started < 30
        assert "pending" in repr(value)  # still queued: it would run once a worker is back
    finally:
        coordinator.shutdown()
        strategy.close()
    with pytest.raises(nd.errors.CancelledError):
        value.get()


def test_a_client_with_a_wrong_key_does_not_stop_a_worker_task():
    """A stray connection (a port scan, another cluster's chief) is refused and the worker task
    goes on serving the right chief."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from nbdist.strategies.parameter_server import worker_task
    from nbdist.strategies.parameter_server.channels import SocketChannel

    (port,) = free_ports(1)
    server = nd.Server(nd.ClusterSpec({"worker": [f"127.0.0.1:{port}"]}), "worker", 0)
    try:
        with pytest.raises(AuthenticationError):
            Client(("127.0.0.1", port), authkey=b"not the cluster's key")
        channel = SocketChannel(f"127.0.0.1:{port}")
        try:
            assert channel.call(worker_task.worker_info)["pid"] == os.getpid()
        finally:
            channel.close()
    finally:
        server.stop()
