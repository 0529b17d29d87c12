"""What one running cluster (2 real CPU engines) computes: one process group, state kept on
the engines between calls, `nd.remote` names, `PerReplica` arguments, reduce and gather in the
notebook, `run_steps`, what the engines print. The cluster is the package's (conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import RemoteError, remote
from nbdist.input.errors import StepsExhaustedError
from tests.cluster.replica_functions import add, recall, remember, replica_sums

pytestmark = pytest.mark.cluster


@interactive
def make_iterator(count):
    global batches, steps_seen
    r = nd.get_replica_context().replica_id_in_sync_group
    batches = iter([torch.tensor([float(10 * r + i)]) for i in range(count)])
    steps_seen = 0


@interactive
def train_step(batch):
    global steps_seen
    steps_seen += 1
    return nd.get_replica_context().all_reduce("sum", batch), steps_seen


def test_engines_form_one_process_group(cluster):
    assert cluster.running and cluster.num_engines == 2
    assert [e.rank for e in cluster.engines] == [0, 1]
    summed, gathered, ranks, in_ctx, in_strategy = cluster.strategy.run(replica_sums)
    assert isinstance(summed, nd.PerReplica)
    for component in summed.values:  # (1 + 2, 0 + 10) on both replicas
        assert torch.equal(component, torch.tensor([3.0, 10.0]))
    for component in gathered.values:
        assert torch.equal(component, torch.tensor([0.0, 1.0]))
    assert ranks.values == (0, 1)
    assert in_ctx.values == (2, 2) and in_strategy.values == (2, 2)
    assert cluster.strategy.num_replicas_in_sync == 2


def test_state_stays_on_the_engines_between_calls(cluster):
    strategy = cluster.strategy
    assert strategy.run(remember, args=(nd.PerReplica([1, 2]),)) is None
    assert strategy.run(recall).values == (10, 20)
    assert cluster.pull("remembered").values == (10, 20)


def test_remote_names_an_engine_variable(cluster):
    cluster.push({"weights": nd.PerReplica([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])})
    out = cluster.strategy.run(
        add, args=(remote("weights"), torch.tensor([10.0, 10.0])), kwargs={"scale": 2.0}
    )
    assert torch.equal(out.values[0], torch.tensor([22.0, 24.0]))
    assert torch.equal(out.values[1], torch.tensor([26.0, 28.0]))
    cluster.push({"holder": torch.nn.Linear(2, 1, bias=False)})
    shapes = cluster.strategy.run(add, args=(remote("holder.weight"), 0.0))
    assert [tuple(v.shape) for v in shapes.values] == [(1, 2), (1, 2)]


@interactive
def shape_of(tensor):
    return torch.tensor(tensor.shape)


def test_remote_paths_take_integer_parts(cluster):
    """`model.0.weight` and `model[0].weight` name a layer of an nn.Sequential (issue 22)."""
    cluster.push({"seq": torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))})
    shapes = cluster.strategy.run(shape_of, args=(remote("seq.0.weight"),))
    assert [v.tolist() for v in shapes.values] == [[3, 2], [3, 2]]
    shapes = cluster.strategy.run(shape_of, args=(remote("seq[1].weight"),))
    assert [v.tolist() for v in shapes.values] == [[1, 3], [1, 3]]
    assert tuple(cluster.pull("seq.1.bias").values[0].shape) == (1,)
    with pytest.raises(RemoteError, match=r"seq \(a Sequential\) has no item 5, so seq\[5\]"):
        cluster.strategy.run(shape_of, args=(remote("seq[5].weight"),))
    with pytest.raises(ValueError, match=r"'model.0.weight' or 'model\[0\].weight'"):
        remote("seq.[0]")


@interactive
def make_counter():
    global seen
    with strategy.scope():  # noqa: F821
        seen = nd.Variable(
            0.0,
            synchronization=nd.VariableSynchronization.ON_READ,
            aggregation=nd.VariableAggregation.SUM,
        )


@interactive
def count(k):
    seen.assign_add(k)
    return seen.read_value()


def test_sync_on_read_variables_follow_one_rule_from_the_notebook(cluster):
    """docs/notebooks.md: inside a replica function a read gives the replica's component;
    anywhere else (a %%distribute cell's top level, cluster.pull) the aggregate."""
    cluster.strategy.run(make_counter)
    local = cluster.strategy.run(count, args=(nd.PerReplica([1.0, 2.0]),))
    assert [float(v) for v in local.values] == [1.0, 2.0]
    assert float(cluster.strategy.reduce("sum", local, axis=None)) == 3.0
    assert [float(v) for v in cluster.pull("seen").values] == [3.0, 3.0]


def test_per_replica_arguments_are_scattered(cluster):
    x = nd.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    out = cluster.strategy.run(add, args=(x,), kwargs={"y": nd.PerReplica([100.0, 200.0])})
    assert [float(v) for v in out.values] == [101.0, 202.0]
    with pytest.raises(ValueError, match="3 component"):
        cluster.strategy.run(add, args=(nd.PerReplica([1, 2, 3]), 1))


def test_reduce_and_gather_in_the_notebook(cluster):
    strategy = cluster.strategy
    x = nd.PerReplica([torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])])
    values = strategy.run(add, args=(x, 0.0))
    assert torch.equal(strategy.gather(values, axis=0), torch.arange(6.0))
    assert float(strategy.reduce("mean", values, axis=0)) == pytest.approx(2.5)  # 15 / 6
    assert float(strategy.reduce(nd.ReduceOp.SUM, values, axis=0)) == 15.0
    same = strategy.run(add, args=(nd.PerReplica([torch.ones(2), 3 * torch.ones(2)]), 0.0))
    assert torch.equal(strategy.reduce("sum", same, axis=None), torch.tensor([4.0, 4.0]))
    assert torch.equal(strategy.reduce("max", same), torch.tensor([3.0, 3.0]))
    assert [tuple(v.tolist()) for v in strategy.experimental_local_results(same)] == [
        (1.0, 1.0),
        (3.0, 3.0),
    ]
    assert strategy.experimental_local_results(5) == (5,)
    with pytest.raises(ValueError, match="different shapes"):
        strategy.reduce("sum", values, axis=None)


def test_reduce_in_the_notebook_refuses_bools_and_bool_axes_and_reduces_empty_values(cluster):
    # Issue 23: the notebook's reduce follows the same rules as the engines' strategy.
    strategy = cluster.strategy
    flags = strategy.run(add, args=(nd.PerReplica([torch.tensor([True, True]),
                                                   torch.tensor([True, False])]), False),
                         kwargs={"scale": True})  # fmt: skip
    assert flags.values[1].dtype == torch.bool
    with pytest.raises(TypeError, match=r"Cannot reduce a bool tensor with MEAN.*t.float\(\)"):
        strategy.reduce("mean", flags, axis=None)
    counts = strategy.run(add, args=(nd.PerReplica([torch.tensor([1, 1]), torch.tensor([1, 0])]),
                                     0), kwargs={"scale": 1})  # fmt: skip
    assert strategy.reduce("sum", counts, axis=None).tolist() == [2, 1]
    with pytest.raises(TypeError, match=r"got True \(a bool\)"):
        strategy.reduce("sum", counts, axis=True)
    empty = strategy.run(add, args=(torch.zeros(0, 2), 0.0))
    assert strategy.reduce("max", empty, axis=0).tolist() == [float("-inf")] * 2
    assert strategy.reduce("min", empty, axis=0).tolist() == [float("inf")] * 2
    with pytest.raises(ValueError, match=r"cannot combine None \(a NoneType\)"):
        strategy.reduce("sum", nd.PerReplica([None, torch.ones(1)]))


def test_run_steps_runs_several_steps_per_round_trip(cluster):
    strategy = cluster.strategy
    strategy.run(make_iterator, args=(5,))
    summed, seen = strategy.run_steps(train_step, "batches", steps=3)
    assert seen.values == (3, 3)
    assert [float(v) for v in summed.values] == [2.0 + 12.0] * 2  # batch 2 of each replica
    summed, seen = strategy.run_steps(train_step, remote("batches"), steps=10)
    assert seen.values == (5, 5)  # stopped when the data ran out
    with pytest.raises(StepsExhaustedError, match=r"exhausted on every engine.*iter\(") as ended:
        strategy.run_steps(train_step, "batches", steps=1)
    assert isinstance(ended.value, StopIteration)  # what a loop over run_steps stops on
    with pytest.raises(RemoteError, match="needs an iterator"):
        strategy.run_steps(train_step, "remembered")


def test_run_refuses_unsupported_options_before_sending(cluster):
    with pytest.raises(nd.errors.UnsupportedOptionError, match="supports no run options"):
        cluster.strategy.run(add, args=(1, 2), options={"xla": True})
    assert cluster.strategy.run(add, args=(nd.PerReplica([1, 2]), 1)).values == (2, 3)


def test_round_trip_time(cluster):
    """A remote run is one round trip: one request per engine, as a bare ipyparallel apply.

    Its time against `DirectView.apply_sync` is measured in benchmarks/bench_engines.py (never
    as a timed test); here the cause of a slower call is checked: an extra request per call
    (a second round trip, a status probe) shows in the client's history of submitted requests.
    """
    client = cluster.client
    view = client.direct_view([e.id for e in cluster.engines])
    noop = interactive(lambda: None)
    cluster.strategy.run(noop)  # warm: first-call set-up may send more
    view.apply_sync(noop)
    before = len(client.history)
    results = [cluster.strategy.run(noop) for _ in range(5)]
    run_requests = len(client.history) - before
    before = len(client.history)
    for _ in range(5):
        view.apply_sync(noop)
    apply_requests = len(client.history) - before
    assert results == [None] * 5  # every replica returned None
    assert apply_requests == 5 * cluster.num_engines
    assert run_requests == apply_requests, (run_requests, apply_requests)


def test_what_the_engines_print_in_run_is_shown_prefixed_like_a_cell(cluster, capsys):
    """strategy.run and %%distribute share one output printer: `[N] line`, stdout and stderr
    apart (before, strategy.run printed `[replica N] line`)."""

    def speak():
        import sys

        rank = nd.get_replica_context().replica_id_in_sync_group
        print(f"out from {rank}", flush=True)
        print(f"err from {rank}", file=sys.stderr, flush=True)
        return rank

    assert cluster.strategy.run(speak, timeout=60).values == (0, 1)
    captured = capsys.readouterr()
    assert "[0] out from 0" in captured.out and "[1] out from 1" in captured.out
    assert "[0] err from 0" in captured.err and "[1] err from 1" in captured.err
    assert "[replica" not in captured.out + captured.err
