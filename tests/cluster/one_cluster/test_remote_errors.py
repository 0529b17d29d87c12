"""Errors from one running cluster's engines (2 real CPU engines): the failing replica named,
the user's frames only, `exit()` refused, unpicklable values and missing names named before or
on sending, a replica that skips a collective releasing the other. The cluster is the
package's (conftest.py).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import RemoteError, RemoteNameError, SerializationError, remote
from nbdist.errors import NbdistError
from tests.cluster.replica_functions import add, recall, remember, replica_sums

pytestmark = pytest.mark.cluster


@interactive
def fail_on_replica_one(message):
    if nd.get_replica_context().replica_id_in_sync_group == 1:
        raise ValueError(message)
    return "fine"


@interactive
def returns_a_lock():
    import threading

    return threading.Lock()


@interactive
def uses_notebook_only_name():
    return only_in_the_notebook  # noqa: F821


def test_an_error_on_one_engine_names_the_replica(cluster):
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(fail_on_replica_one, args=("the data ran dry",))
    error = info.value
    assert isinstance(error, NbdistError) and isinstance(error, RuntimeError)
    assert error.replicas == (1,) and error.first.replica == 1
    assert error.first.ename == "ValueError"
    message = str(error)
    assert "1 of 2 replica(s) failed in strategy.run(fail_on_replica_one)" in message
    assert "replica 1 (engine" in message
    assert "Traceback" in message and "in fail_on_replica_one" in message
    assert "raise ValueError(message)" in message  # the source line, shipped with the function
    assert "ValueError: [replica 1 of 2] the data ran dry" in message
    # Replica 0 was not waiting for replica 1, so the group is still usable.
    assert cluster.broken is None
    summed = cluster.strategy.run(replica_sums)[0]
    assert torch.equal(summed.values[1], torch.tensor([3.0, 10.0]))


@interactive
def fails_on_its_third_line():
    value = 1
    return value + not_defined_anywhere  # noqa: F821


@interactive
def lines_the_engine_knows_under(filename):
    import linecache

    lines = [f"# another cell's line {i}\n" for i in range(1, 2000)]
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


@interactive
def calls_exit(name):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        {"exit": exit, "quit": quit}[name]()
    return dist.get_rank()


def test_a_traceback_shows_the_functions_own_line_not_the_engines(cluster):
    """Issue 23, item 9: the engine knows other lines under the function's file name (Note
    [Shipped source wins]); the traceback shows the function's line, not one of those."""
    filename = fails_on_its_third_line.__code__.co_filename
    cluster.strategy.run(lines_the_engine_knows_under, args=(filename,))
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(fails_on_its_third_line)
    message = str(info.value)
    assert "return value + not_defined_anywhere" in message
    assert "another cell's line" not in message


@pytest.mark.parametrize("name", ["exit", "quit"])
def test_exit_in_a_function_is_refused_there_and_the_engine_lives(cluster, name):
    """Issue 23, item 7: `exit()` on one replica fails the call that made it, naming
    `%dist stop`; the engine keeps running (its state too) and the next call works."""
    cluster.strategy.run(remember, args=(nd.PerReplica([1, 2]),))
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(calls_exit, args=(name,))
    assert info.value.replicas == (1,) and info.value.first.ename == "ContextError"
    assert "exit() and quit() are refused on the engines" in str(info.value)
    assert "%dist stop" in str(info.value) and "cluster.stop()" in str(info.value)
    assert "autocall.py" not in str(info.value) and "engine_side" not in str(info.value)
    assert cluster.broken is None and all(row.state == "alive" for row in cluster.status())
    assert cluster.strategy.run(recall).values == (10, 20)


def test_an_unpicklable_argument_is_refused_before_sending(cluster):
    with pytest.raises(SerializationError) as info:
        cluster.strategy.run(add, args=(1, threading.Lock()))
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert "args[1]" in message and "_thread.lock" in message and "nd.remote(" in message
    with pytest.raises(RemoteError, match=r"result \(a lock\) cannot be sent back"):
        cluster.strategy.run(returns_a_lock)


def test_a_missing_remote_name_is_named(cluster):
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(add, args=(remote("no_such_model"), 1))
    error = info.value
    assert error.replicas == (0, 1)
    assert {f.ename for f in error.failures} == {RemoteNameError.__name__}
    assert "nd.remote('no_such_model')" in str(error)
    assert "has no variable 'no_such_model'" in str(error)
    with pytest.raises(ValueError, match="variable name"):
        remote("not a name")


def test_a_name_only_the_notebook_has_gets_a_hint(cluster, monkeypatch):
    # the notebook's namespace as the function sees it: `@interactive` bound its globals to
    # `__main__` when this module was imported (an IPython shell that another test of this
    # process started since has replaced sys.modules["__main__"])
    monkeypatch.setitem(uses_notebook_only_name.__globals__, "only_in_the_notebook", 1)
    with pytest.raises(RemoteError, match=r"cluster.push\(\{'only_in_the_notebook'"):
        cluster.strategy.run(uses_notebook_only_name)


@interactive
def mismatched_all_reduce():
    ctx = nd.get_replica_context()
    return ctx.all_reduce("sum", torch.ones(2 + ctx.replica_id_in_sync_group))


@interactive
def divides_by_zero():
    return 1 / 0


def _nbdist_frames(text):
    return [line for line in text.splitlines() if line.lstrip().startswith("File ") and
            f"{os.sep}nbdist{os.sep}" in line]  # fmt: skip


def test_remote_tracebacks_show_the_users_frames_only(cluster):
    """docs/errors.md: a RemoteError shows the user's frames, none of nbdist's, also for an error
    raised inside an nbdist call (here a collective); `.details` keeps every frame."""
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(divides_by_zero)
    assert "in divides_by_zero" in str(info.value)
    assert _nbdist_frames(str(info.value)) == []
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(mismatched_all_reduce)
    text = str(info.value)
    assert "CollectiveMismatchError" in text and "in mismatched_all_reduce" in text
    assert _nbdist_frames(text) == [], text
    assert "in mismatched_all_reduce" in info.value.details
    assert cluster.broken is None, cluster.broken  # a mismatch is detected before any data moves


@interactive
def all_reduce_on_replica_zero_only():
    ctx = nd.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        return ctx.all_reduce("sum", torch.ones(2))
    return None


def test_a_replica_that_returns_without_the_collective_releases_the_other_in_seconds(cluster):
    """docs/troubleshooting.md: not after the 300 s collective timeout (measured 1.5 s)."""
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"replica 1 finished strategy.run\(.*without entering"):
        cluster.strategy.run(all_reduce_on_replica_zero_only)
    assert time.monotonic() - started < 20
