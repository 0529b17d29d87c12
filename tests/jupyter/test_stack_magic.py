"""`%dist stack`, `cluster.stacks()`, the automatic view (`--stack-after`) and the collective
recorder (`nd.debug.compare_collectives`), in a real in-process IPython shell on 2 real CPU
engines.

A cell runs in the main thread (as in a notebook) while a second thread asks for the stacks,
as a second client would. The last tests stop and kill an engine.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from IPython.core.error import UsageError

import nbdist as nd
from nbdist.cluster import RemoteError
from nbdist.magics import DistMagics, current_cluster

pytestmark = pytest.mark.cluster

WAIT_S = 30.0

# Replica 1 waits in an all-reduce that replica 0 does not enter while it sleeps.
HANG = """
import time
if strategy.cluster_resolver.task_id == 0:
    time.sleep({sleep})  # replica 0 is busy here
else:
    strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(4)))
"""


def in_thread(fn):
    """Run `fn` in a thread (a second client); returns `(thread, result dict)`."""
    result: dict = {}

    def body():
        try:
            result["value"] = fn()
        except BaseException as error:  # reported by the test
            result["error"] = error

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, result


def stacks_once_replica_waits(cluster, replica: int):
    """`cluster.stacks()` (timed) once `replica` is inside a collective."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        began = time.monotonic()
        stacks = cluster.stacks()
        took = time.monotonic() - began
        current = stacks[replica].collective
        if current is not None and current.get("end") is None and current["waiting_s"] > 0.5:
            return stacks, took
        time.sleep(0.1)
    raise AssertionError(f"replica {replica} never waited in a collective")


def test_stack_without_a_cluster_names_the_fix(ipython):
    magics = DistMagics(ipython)
    with pytest.raises(UsageError, match=r"no cluster is running: start one with `%dist start`"):
        magics.dist("stack")


def test_stack_of_idle_engines(dist_shell, capsys):
    dist_shell.run_line_magic("dist", "stack")
    out = capsys.readouterr().out
    assert out.startswith("Stacks of 2 replicas (taken in "), out
    assert "replicas 0, 1:" in out, out  # both idle in the same place: printed once
    assert "frames in" in out, out  # ipyparallel's and python's frames folded
    with pytest.raises(UsageError, match=r"unknown argument\(s\) \['--bogus'\]"):
        dist_shell.run_line_magic("dist", "stack --bogus")


def test_stack_while_a_replica_waits_in_a_collective(dist_shell, capsys):
    cluster = current_cluster()
    thread, seen = in_thread(lambda: stacks_once_replica_waits(cluster, 1))
    with pytest.raises(RemoteError) as caught:
        dist_shell.run_cell_magic("distribute", "--stack-after 2", HANG.format(sleep=7))
    thread.join(WAIT_S)
    assert "error" not in seen, seen.get("error")
    stacks, took = seen["value"]
    assert took < 2.0, took
    one, zero = stacks[1], stacks[0]
    assert one.state == zero.state == "running"
    assert one.collective["op"] == "all_reduce:SUM" and one.collective["end"] is None
    assert one.collective["seq"] >= 1 and one.collective["bytes"] == 16
    assert any("all_reduce" in line for *_, line in one.main), one.main
    assert any("time.sleep(7)" in line for *_, line in zero.main), zero.main
    view = nd.debug.format_stacks(stacks)
    assert f"replica 1 (pid {one.pid} on {one.host}): in all_reduce:SUM #" in view, view
    assert "time.sleep(7)  # replica 0 is busy here" in view, view
    # the automatic view appeared once under the cell, and the error carries it
    out = capsys.readouterr().out
    assert out.count("(--stack-after 2); the cell goes on.") == 1, out
    rendered = "\n".join(caught.value._render_traceback_())
    assert "Stacks shown while it waited:" in rendered, rendered
    assert "in all_reduce:SUM #" in rendered, rendered


def test_no_automatic_view_under_a_cell_that_does_not_wait(dist_shell, capsys):
    out = dist_shell.run_cell_magic("distribute", "--stack-after 1", "import time\ntime.sleep(2)")
    assert out is None
    assert "the cell goes on" not in capsys.readouterr().out


def test_stack_after_rejects_negative(dist_shell):
    with pytest.raises(UsageError, match=r"--stack-after must be 0 \(never\) or a number"):
        dist_shell.run_cell_magic("distribute", "--stack-after -1", "1")


def test_stack_of_a_main_thread_blocked_in_recv_and_in_sleep(dist_shell):
    cluster = current_cluster()
    cell = """
import time
import torch.distributed as dist
if strategy.cluster_resolver.task_id == 1:
    dist.recv(torch.zeros(2), src=0)  # blocked in C
else:
    time.sleep(6)  # blocked in C too
    dist.send(torch.zeros(2), dst=1)
"""

    def look():
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            stacks = cluster.stacks()
            lines = [[line for *_, line in s.main] for s in stacks]
            if any("dist.recv" in x for x in lines[1]) and any("time.sleep" in x for x in lines[0]):
                return stacks
            time.sleep(0.2)
        raise AssertionError("never saw recv and sleep")

    thread, seen = in_thread(look)
    dist_shell.run_cell_magic("distribute", "--stack-after 0", cell)
    thread.join(WAIT_S)
    assert "error" not in seen, seen.get("error")
    stacks = seen["value"]
    assert stacks[1].main[-1][2] in ("recv", "irecv", "wait"), stacks[1].main[-3:]  # torch's frame


def test_compare_collectives_names_a_skipped_all_reduce(dist_shell, capsys):
    cell = """
ar = lambda: strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(2)))
ar()
if strategy.cluster_resolver.task_id == 0:
    ar()  # replica 1 skips this one
"""
    with pytest.raises(RemoteError):
        dist_shell.run_cell_magic("distribute", "--stack-after 0", cell)
    records = current_cluster().collective_records()
    found = nd.debug.compare_collectives(records)
    assert found is not None and found.reason == "missing replica", found
    assert found.seq == max(e["seq"] for e in records[0]), (found, records)
    assert found.sides[1] == ("missing", (1,)), found
    assert found.sites[0].startswith("<distribute-cell-"), found.sites  # the user's cell
    capsys.readouterr()
    dist_shell.run_line_magic("dist", "stack --collectives")
    assert f"Collectives disagree at collective #{found.seq}: missing replica" in (
        capsys.readouterr().out
    )


def test_compare_collectives_names_a_shape_mismatch(dist_shell):
    cell = """
n = 4 if strategy.cluster_resolver.task_id == 0 else 5
strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(n)))
"""
    with pytest.raises(RemoteError, match="CollectiveMismatchError"):
        dist_shell.run_cell_magic("distribute", "", cell)
    records = current_cluster().collective_records()
    found = nd.debug.compare_collectives(records)
    assert found is not None and found.reason == "different shapes", records
    assert [replicas for _, replicas in found.sides] == [(0,), (1,)]
    assert "(4,)" in found.sides[0][0] and "(5,)" in found.sides[1][0]
    assert str(found).startswith(f"collective #{found.seq}: different shapes: replica 0: ")


def test_stack_names_a_silent_and_a_dead_engine(dist_shell):
    cluster = current_cluster()
    pid = cluster.engines[1].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        stacks = cluster.stacks(timeout=2.0)
        assert time.monotonic() - began < 3.0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stacks[1].state == "no answer" and "did not answer within 2 s" in stacks[1].note
    assert stacks[0].state == "running" and stacks[0].main
    view = nd.debug.format_stacks(stacks)
    assert "no answer: did not answer within 2 s" in view, view
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while True:
        stacks = cluster.stacks()
        if stacks[1].state == "dead" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stacks[1].state == "dead", stacks[1]
    assert stacks[0].state == "running" and stacks[0].main
    assert f"replica 1 (pid {pid} on " in nd.debug.format_stacks(stacks)
