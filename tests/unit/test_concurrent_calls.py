"""Calls into one in-process strategy from several threads, and collectives called where no
replica can join them (issue 23, items 1, 6 and 9).

Two threads calling `run` on one strategy used to pair each other's collectives (`[21.0,
12.0]`: the replicas even disagreed) and then deadlock; a `run` or a collective inside a
`merge_call` function waited forever; a thread started inside a replica function all-reduced
its own value alone. Now calls take turns, and the others raise `ContextError` at once.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import nbdist as nd
from nbdist.collectives.local import LocalGroup
from nbdist.core.reduce.cross_device import ReductionToOneDevice
from nbdist.core.reduce.options import CommunicationOptions
from nbdist.errors import BusyError, CollectiveTimeoutError, ContextError
from nbdist.strategies.local import LocalStrategy

TWO = ["cpu:0", "cpu:1"]
JOIN_S = 60.0


def _strategies():
    return {
        "mirrored": lambda: nd.MirroredStrategy(TWO),
        "central_storage": lambda: nd.experimental.CentralStorageStrategy(TWO),
        "one_device": lambda: nd.OneDeviceStrategy("cpu:0"),
        "default": lambda: nd.get_strategy(),
    }


def _replica_sum(scale: float):
    ctx = nd.get_replica_context()
    return ctx.all_reduce("sum", torch.tensor(scale * (ctx.replica_id_in_sync_group + 1.0)))


@pytest.mark.parametrize("name", list(_strategies()))
def test_two_threads_calling_run_get_their_own_values(name):
    strategy = _strategies()[name]()
    n = strategy.num_replicas_in_sync
    expected = {1.0: n * (n + 1) / 2, 10.0: 10 * n * (n + 1) / 2}
    wrong: list = []
    errors: list = []
    start = threading.Barrier(2, timeout=JOIN_S)

    def caller(scale: float) -> None:
        try:
            start.wait()
            for _ in range(40):
                out = strategy.run(_replica_sum, args=(scale,))
                values = [float(v) for v in strategy.experimental_local_results(out)]
                if values != [expected[scale]] * n:
                    wrong.append(values)
        except BaseException as error:  # reported below, with the values
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(s,), daemon=True) for s in expected]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert not errors, errors[:2]
    assert not wrong, wrong[:5]


def _options_strategy(timeout: float) -> LocalStrategy:
    """A two-replica in-process strategy with a short collective timeout."""
    options = CommunicationOptions(timeout_seconds=timeout)
    return LocalStrategy(tuple(TWO), tuple(TWO), ReductionToOneDevice(), options)


def test_a_second_call_waits_its_turn_and_runs_after_the_first():
    strategy = nd.MirroredStrategy(TWO)
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first_step():
        if nd.get_replica_context().replica_id_in_sync_group == 0:
            inside.set()
            assert release.wait(JOIN_S)
        out = _replica_sum(1.0)
        order.append("first")
        return out

    results: dict[str, object] = {}
    first = threading.Thread(
        target=lambda: results.setdefault("first", strategy.run(first_step)), daemon=True
    )
    first.start()
    assert inside.wait(JOIN_S)

    def second_step():
        order.append("second")
        return _replica_sum(10.0)

    second = threading.Thread(
        target=lambda: results.setdefault("second", strategy.run(second_step)), daemon=True
    )
    second.start()
    second.join(0.3)  # the second call must still be waiting while the first holds its turn
    assert second.is_alive() and "second" not in order
    release.set()
    first.join(JOIN_S)
    second.join(JOIN_S)
    assert order == ["first", "first", "second", "second"]
    assert [float(v) for v in results["first"].values] == [3.0, 3.0]
    assert [float(v) for v in results["second"].values] == [30.0, 30.0]


def test_a_call_that_waits_past_the_timeout_is_refused_by_name():
    strategy = _options_strategy(timeout=0.5)
    inside, release = threading.Event(), threading.Event()

    def holding_step():
        inside.set()
        assert release.wait(JOIN_S)

    holder = threading.Thread(target=strategy.run, args=(holding_step,), name="trainer")
    holder.start()
    try:
        assert inside.wait(JOIN_S)
        begin = time.monotonic()
        with pytest.raises(BusyError, match="another thread's run on this strategy") as info:
            strategy.run(lambda: 1)
        assert time.monotonic() - begin < 10
        assert isinstance(info.value, TimeoutError)
        assert "'trainer'" in str(info.value) and "timeout_seconds" in str(info.value)
    finally:
        release.set()
        holder.join(JOIN_S)
    assert not holder.is_alive()
    assert [float(v) for v in strategy.run(_replica_sum, args=(1.0,)).values] == [3.0, 3.0]


def test_run_inside_a_merge_call_function_is_refused_at_once():
    strategy = nd.MirroredStrategy(TWO)
    begin = time.monotonic()
    with pytest.raises(ContextError, match=r"strategy\.run was called inside a merge_call"):
        strategy.run(lambda: nd.get_replica_context().merge_call(lambda s: s.run(lambda: 1)))
    assert time.monotonic() - begin < 10
    # The strategy is usable afterwards.
    assert [float(v) for v in strategy.run(_replica_sum, args=(1.0,)).values] == [3.0, 3.0]


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "merge_call"])
def test_a_collective_of_a_captured_context_inside_merge_fn_is_refused_at_once(collective):
    strategy = nd.MirroredStrategy(TWO)
    calls = {
        "all_reduce": lambda ctx: ctx.all_reduce("sum", torch.ones(1)),
        "all_gather": lambda ctx: ctx.all_gather(torch.ones(1), axis=0),
        "merge_call": lambda ctx: ctx.merge_call(lambda s: 1),
    }

    def step():
        ctx = nd.get_replica_context()
        return ctx.merge_call(lambda s: calls[collective](ctx))

    begin = time.monotonic()
    with pytest.raises(ContextError, match=rf"ReplicaContext\.{collective} was called inside a"):
        strategy.run(step)
    assert time.monotonic() - begin < 10
    assert [float(v) for v in strategy.run(_replica_sum, args=(1.0,)).values] == [3.0, 3.0]


def test_a_replica_context_used_after_run_is_refused():
    strategy = nd.MirroredStrategy(TWO)
    captured = strategy.run(nd.get_replica_context).values[1]
    with pytest.raises(ContextError, match=r"outside the strategy\.run that made this context"):
        captured.all_reduce("sum", torch.ones(1))


def test_another_replicas_context_is_refused():
    strategy = nd.MirroredStrategy(TWO)
    contexts = strategy.run(nd.get_replica_context).values

    def step():
        mine = nd.get_replica_context().replica_id_in_sync_group
        return contexts[1 - mine].all_reduce("sum", torch.ones(1))

    with pytest.raises(ContextError, match="Each replica calls collectives on its own context"):
        strategy.run(step)


def test_a_merge_call_that_never_returns_times_out_on_the_waiting_replicas():
    group = LocalGroup(2, timeout=0.5)
    release = threading.Event()
    outcome: dict[int, BaseException | object] = {}

    def replica(i: int) -> None:
        def combine(payloads):
            assert release.wait(JOIN_S)  # a merge function that waits for something else
            return payloads

        try:
            outcome[i] = group.exchange(i, "merge_call", i, combine)
        except BaseException as error:
            outcome[i] = error
            release.set()

    first = threading.Thread(target=replica, args=(0,), daemon=True)
    first.start()
    # Replica 1 arrives second, so it combines; replica 0 waits in "combining".
    while group._slots.get(0) is None or group._slots[0].arrivals[0] is None:
        first.join(0.01)
    second = threading.Thread(target=replica, args=(1,), daemon=True)
    second.start()
    first.join(JOIN_S)
    second.join(JOIN_S)
    assert not first.is_alive() and not second.is_alive()
    error = outcome[0]
    assert isinstance(error, CollectiveTimeoutError), error
    assert "replica 1, which combines it" in str(error)
    assert "merge_call function" in str(error)


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_a_thread_started_in_a_replica_cannot_all_reduce_alone(name):
    strategy = _strategies()[name]()
    seen: list = []

    def in_thread() -> None:
        try:
            seen.append(nd.get_replica_context().all_reduce("sum", torch.ones(1)))
        except BaseException as error:
            seen.append(error)

    def step():
        thread = threading.Thread(target=in_thread, name="helper")
        thread.start()
        thread.join(JOIN_S)
        return torch.zeros(1)

    strategy.run(step)
    assert len(seen) == 2
    for error in seen:
        assert isinstance(error, ContextError), error
        assert "'helper'" in str(error) and "was started while" in str(error)
        assert "Call all_reduce in the replica function's own thread" in str(error)


def test_a_thread_outside_any_run_keeps_the_default_context():
    strategy = nd.MirroredStrategy(TWO)
    strategy.run(lambda: 1)  # a run that has finished leaves nothing behind
    seen: list = []
    thread = threading.Thread(
        target=lambda: seen.append(nd.get_replica_context().all_reduce("sum", torch.ones(1)))
    )
    thread.start()
    thread.join(JOIN_S)
    assert [float(v) for v in seen] == [1.0]
