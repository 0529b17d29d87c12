"""TF's "Parameter server training" tutorial, ported literally (issue 22, item 7): an
optimizer created in `scope()` keeps its state across scheduled functions, the tutorial's
per-worker dataset pattern, TF's `Server` arguments, and `variable_partitioner` through
`nd.Cluster` / `%dist start`. Tasks are `nd.Server` threads of this process (1 worker, 2 ps)."""

from __future__ import annotations

import threading

import pytest
import torch
from IPython.core.error import UsageError

import nbdist as nd
from nbdist.experimental.partitioners import FixedShardsPartitioner, MinSizePartitioner
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
    """Every variable split in 2 shards over the 2 ps tasks (the weights' slots too)."""
    strategy = nd.ParameterServerStrategy(spec, variable_partitioner=FixedShardsPartitioner(2))
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    yield strategy, coordinator
    coordinator.shutdown()
    strategy.close()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


OPTIMIZERS = {
    "RMSprop": lambda params: torch.optim.RMSprop(params, lr=0.05),
    "Adam": lambda params: torch.optim.Adam(params, lr=0.05, amsgrad=True),
    "SGD-momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "Adagrad": lambda params: torch.optim.Adagrad(params, lr=0.1, initial_accumulator_value=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_optimizer_created_in_scope_keeps_its_state_across_functions(coordinated, name):
    """One worker runs the functions in order, so 25 functions of one step each must train
    exactly as 25 steps of one optimizer on one device (TF keeps slots on the ps). With state
    that lasted one function, RMSprop's first step of each function is ~3x too large."""
    strategy, coordinator = coordinated
    torch.manual_seed(0)
    with strategy.scope():
        model = _model()
        optimizer = OPTIMIZERS[name](model.parameters())
    assert strategy.placement(model[0].weight)[1].ps == 1  # 6 rows over both ps tasks
    reference = _model()
    reference.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    reference_optimizer = OPTIMIZERS[name](reference.parameters())
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = [coordinator.schedule(step, args=(x, y)) for _ in range(25)]
    coordinator.join()
    expected = []
    for _ in range(25):
        reference_optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(reference(x), y)
        loss.backward()
        reference_optimizer.step()
        expected.append(loss.item())
    got = [float(value.fetch()) for value in losses]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    strategy.pull(model)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_a_learning_rate_changed_on_the_chief_applies_to_the_next_function(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        weight = torch.nn.Parameter(torch.zeros(3))
        holder = torch.nn.ParameterList([weight])
        optimizer = torch.optim.SGD(holder.parameters(), lr=1.0, momentum=0.5)

    def step():
        optimizer.zero_grad()
        (-weight.sum()).backward()  # gradient -1: each step adds lr * buffer
        optimizer.step()

    coordinator.schedule(step).get()  # buffer 1, weight 1
    optimizer.param_groups[0]["lr"] = 0.5
    coordinator.schedule(step).get()  # buffer 1.5, weight 1 + 0.75
    strategy.pull(holder)
    torch.testing.assert_close(weight.detach(), torch.full((3,), 1.75))


def test_an_optimizer_mixing_strategy_and_other_parameters_is_refused(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        inside = torch.nn.Linear(2, 1)
    outside = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD([*inside.parameters(), *outside.parameters()], lr=0.1)
    with pytest.raises(TypeError, match=r"both parameters created in this.*scope\(\)"):
        coordinator.schedule(lambda: optimizer.step())


# -- the tutorial's per-worker dataset: per_worker_dataset_fn captures `strategy` -------------
def test_the_tutorials_per_worker_dataset_fn_works(coordinated):
    strategy, coordinator = coordinated
    contexts = []

    def dataset_fn(input_context):
        contexts.append(input_context)  # on the worker: not seen here
        batch = input_context.get_per_replica_batch_size(8)
        data = torch.arange(64.0).reshape(32, 2)
        shard = data[input_context.input_pipeline_id :: input_context.num_input_pipelines]
        return [
            (shard[i : i + batch], input_context.num_input_pipelines)
            for i in range(0, len(shard), batch)
        ]

    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    def step_fn(iterator):
        def replica_fn(batch):
            x, pipelines = batch
            return x.sum(), pipelines

        return strategy.run(replica_fn, args=(next(iterator),))

    first, second = (coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in "ab")
    assert first.fetch() == (pytest.approx(float(torch.arange(16.0).sum())), 1)
    assert second.fetch()[0] == pytest.approx(float(torch.arange(16.0, 32.0).sum()))
    assert contexts == []


def test_a_dataset_fn_capturing_what_cannot_be_pickled_names_it(coordinated):
    _, coordinator = coordinated
    lock = threading.Lock()

    def dataset_fn():
        with lock:
            return [1, 2]

    with pytest.raises(TypeError, match=r"dataset_fn cannot be sent.*'lock' \(a lock it uses\)"):
        coordinator.create_per_worker_dataset(dataset_fn)


# -- TF's Server arguments -------------------------------------------------------------------
def test_tfs_server_arguments_are_accepted_or_refused_by_name(spec):
    server = nd.Server(spec, "worker", 0, protocol="grpc", config=None, start=False)
    assert server.target.startswith("nbdist://")
    with pytest.raises(nd.errors.UnsupportedOptionError, match=r"config=dict.*Leave config out"):
        nd.Server(spec, "worker", 0, config={"intra_op_parallelism_threads": 2}, start=False)
    with pytest.raises(nd.errors.UnsupportedOptionError, match=r"protocol='grpc\+verbs'"):
        nd.Server(spec, "worker", 0, protocol="grpc+verbs", start=False)


# -- variable_partitioner through nd.Cluster and %dist start ---------------------------------
def test_cluster_takes_a_variable_partitioner():
    partitioner = FixedShardsPartitioner(2)
    cluster = nd.Cluster(n=3, strategy="parameter_server", num_ps=1,
                         variable_partitioner=partitioner)  # fmt: skip
    assert cluster.variable_partitioner is partitioner
    with pytest.raises(TypeError, match="variable_partitioner must be None or a callable"):
        nd.Cluster(n=3, strategy="parameter_server", variable_partitioner=2)
    with pytest.raises(ValueError, match="variable_partitioner is for strategy='parameter_server'"):
        nd.Cluster(n=2, variable_partitioner=partitioner)


def test_dist_start_parses_a_variable_partitioner():
    from nbdist.magics.core import partitioner_option

    assert partitioner_option("fixed:3", {})(torch.Size([10, 2]), torch.float32) == [3, 1]
    made = partitioner_option("min_size:64:8", {})
    assert isinstance(made, MinSizePartitioner)
    assert made(torch.Size([10, 4]), torch.float32) == [3, 1]
    mine = FixedShardsPartitioner(4)
    assert partitioner_option("mine", {"mine": mine}) is mine
    for bad in ("fixed", "fixed:x", "fixed:2:3", "nowhere"):
        with pytest.raises(UsageError, match="--variable-partitioner"):
            partitioner_option(bad, {})


# -- the rule for sync-on-read variables (docs/notebooks.md, docs/parameter-server.md) -------
def _count(seen):
    seen.assign_add(torch.ones(()))
    return seen.read_value()  # in a function: the ps value as read, plus this function's own


def test_a_sync_on_read_variable_is_one_copy_on_the_ps_that_the_chief_reads_whole(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        seen = nd.Variable(
            0.0,
            synchronization=nd.VariableSynchronization.ON_READ,
            aggregation=nd.VariableAggregation.SUM,
            name="seen",
        )
    assert seen.synchronization is nd.VariableSynchronization.ON_READ
    assert seen.aggregation is nd.VariableAggregation.SUM
    assert seen.trainable is False  # TF's default for ON_READ
    values = [coordinator.schedule(_count, args=(seen,)) for _ in range(5)]
    coordinator.join()
    assert float(seen.read_value()) == 5.0  # every worker's updates: the aggregate
    assert sorted(float(v.fetch()) for v in values) == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_the_chief_pulls_and_pushes_an_optimizers_state_for_checkpoints(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        model = torch.nn.Linear(3, 4)  # weight split in 2 shards of 2 rows
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    reference = torch.nn.Linear(3, 4)
    reference.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    x = torch.randn(8, 3)

    def step(x):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    for _ in range(3):
        coordinator.schedule(step, args=(x,))
        reference_optimizer.zero_grad()
        reference(x).square().mean().backward()
        reference_optimizer.step()
    coordinator.join()
    assert not optimizer.state  # the state lives on the ps tasks
    strategy.pull(optimizer)
    mine, theirs = optimizer.state_dict()["state"], reference_optimizer.state_dict()["state"]
    for index in theirs:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[index][name], theirs[index][name])
    # A restored state goes back with push: the next function continues from it.
    for state in optimizer.state.values():
        state["exp_avg"].zero_()
    strategy.push(optimizer)
    optimizer.state.clear()
    strategy.pull(optimizer)
    assert all(float(s["exp_avg"].abs().sum()) == 0 for s in optimizer.state.values())
    with pytest.raises(TypeError, match="trains no parameter created in this strategy"):
        strategy.pull(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))


def test_a_pulled_optimizer_state_does_not_travel_with_every_function(coordinated):
    strategy, coordinator = coordinated
    with strategy.scope():
        model = torch.nn.Linear(200, 50)
        optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        model(torch.ones(1, 200)).sum().backward()
        optimizer.step()

    coordinator.schedule(step).get()
    small = len(coordinator._encode("step", step, (), {}))
    strategy.pull(optimizer)  # 10,000 floats of state on the chief now
    assert optimizer.state and len(coordinator._encode("step", step, (), {})) < small + 1000


def test_an_in_process_cluster_of_two_workers_keeps_each_workers_state_apart(spec):
    """TF's tutorial starts its cluster in one process (`create_in_process_cluster`): two
    `nd.Server` workers of one process must not share a per-worker iterator (a generator run
    by two threads at once: "generator already executing") nor parameter copies."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports], "ps": spec.job_tasks("ps")}
    workers = [nd.Server(nd.ClusterSpec(cluster), "worker", i) for i in range(2)]
    strategy = nd.ParameterServerStrategy(nd.ClusterSpec(cluster))
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    try:
        with strategy.scope():
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01)

        def dataset_fn():
            def batches():
                index = 0
                while True:  # batch number `index` of this worker's own stream
                    x = torch.randn(16, 4)
                    yield index, x, x.sum(1, keepdim=True)
                    index += 1

            return batches()

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        def step(iterator):
            index, x, y = next(iterator)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            return index, loss.detach()

        values = [coordinator.schedule(step, args=(iterator,)) for _ in range(60)]
        coordinator.join()
        seen = {0: [], 1: []}
        for value in values:
            index, loss = value.get()
            assert loss.isfinite()
            seen[value.worker].append(index)
        assert seen[0] and seen[1], seen
        # Each worker read its own stream from its start (a shared one interleaves them).
        assert all(sorted(indices) == list(range(len(indices))) for indices in seen.values())
    finally:
        coordinator.shutdown()
        strategy.close()
        for worker in workers:
            worker.stop()
