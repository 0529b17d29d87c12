"""ParameterServerStrategy with `nd.Server` task processes on 127.0.0.1 (the test is the
chief): asynchronous training of the digits classifier, a worker killed with SIGKILL while
functions run, the same worker restarted, and a ps task killed."""

from __future__ import annotations

import time

import pytest
import torch

import nbdist as nd
from nbdist.app import ps_training
from nbdist.testing.ps_tasks import TaskProcesses
from tests.ps.timing import first_work_after

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _steps_and_count(model, counter, iterator):
    """One scheduled function: 5 SGD steps and +1 on every element of `counter`."""
    loss = ps_training.train_steps(model, iterator, steps=5)
    counter.assign_add(torch.ones(counter.shape))
    return loss


def _where():
    import os

    return os.getpid()


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_training_survives_a_killed_worker_and_uses_it_again_after_restart():
    with TaskProcesses(num_workers=2, num_ps=1) as tasks:
        strategy = nd.ParameterServerStrategy(tasks.spec)
        with strategy.scope():
            model = ps_training.build_model()
            counter = nd.Variable(torch.zeros(2000), name="counter")
        coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(ps_training.dataset_fn()))
            values = [
                coordinator.schedule(_steps_and_count, args=(model, counter, iterator))
                for _ in range(120)
            ]
            values[10].get()  # both workers are busy now: the queue is long
            killed_at = time.monotonic()
            tasks.kill("worker", 1)
            coordinator.join()
            finished = time.monotonic() - killed_at
            assert all(isinstance(v.fetch(), float) or v.fetch().shape == () for v in values)
            count = counter.read_value()
            # Every function ran at least once; an update is applied whole or not at all.
            assert torch.all(count == count[0]), "an update was half applied"
            assert count[0] >= len(values)
            strategy.pull(model)
            accuracy = ps_training.evaluate(model)
            assert accuracy >= 0.9, accuracy
            print(f"worker killed: training finished {finished:.2f} s later, acc {accuracy:.3f}")

            # The worker comes back on its address and gets work again.
            restarting = time.monotonic()
            tasks.start("worker", 1)
            _wait(strategy.worker_channels[1].alive, 60, "worker 1 to come back")
            later = [
                coordinator.schedule(_steps_and_count, args=(model, counter, iterator))
                for _ in range(40)
            ]
            work_after = first_work_after(later, worker=1, since=restarting)
            print(f"worker task restarted: work on it {work_after:.2f} s after its start")
            coordinator.join()
            assert {v.worker for v in later} == {0, 1}
            restarted = tasks.procs[("worker", 1)].pid
            ran_on = {v.fetch() for v in [coordinator.schedule(_where) for _ in range(20)]}
            assert ran_on <= {tasks.procs[("worker", 0)].pid, restarted}
        finally:
            coordinator.shutdown()
            strategy.close()


def test_a_killed_ps_makes_join_and_schedule_raise_naming_it():
    with TaskProcesses(num_workers=1, num_ps=2) as tasks:
        strategy = nd.ParameterServerStrategy(tasks.spec)
        with strategy.scope():
            model = ps_training.build_model()
        coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(ps_training.dataset_fn()))
            coordinator.schedule(ps_training.train_steps, args=(model, iterator)).get()
            for _ in range(50):
                coordinator.schedule(ps_training.train_steps, args=(model, iterator))
            killed_at = time.monotonic()
            tasks.kill("ps", 1)
            with pytest.raises(nd.errors.PSUnavailableError, match="/job:ps/task:1") as info:
                coordinator.join()
            seconds = time.monotonic() - killed_at
            assert info.value.ps == 1 and info.value.address == tasks.ps[1]
            assert seconds < 30, seconds
            print(f"ps killed: PSUnavailableError after {seconds:.2f} s")
            with pytest.raises(nd.PSUnavailableError, match="checkpoint"):
                coordinator.schedule(ps_training.train_steps, args=(model, iterator))
            with pytest.raises(nd.PSUnavailableError):
                coordinator.done()
        finally:
            coordinator.shutdown()
            strategy.close()
