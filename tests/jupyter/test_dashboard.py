"""The dashboard over 2 real engines: after a training cell, and with an engine killed."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import nbdist as nd

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAIN = """
import os
rank = int(os.environ["RANK"])
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def step(x):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    ctx = nd.get_replica_context()
    for p in model.parameters():
        p.grad = ctx.all_reduce("mean", p.grad)
    optimizer.step()
    return loss.detach()

for i in range(5):  # each engine its own batches: the losses differ, the parameters do not
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * i + rank))
    loss = strategy.run(step, args=(x,))
    nd.log(step=i, loss=loss)
"""


def test_dashboard_after_a_two_engine_training_cell(dist_shell):
    before = time.time()
    dist_shell.run_cell_magic("distribute", "", TRAIN)
    after = time.time()
    board = nd.dashboard()
    try:
        data = board.data
        assert sorted(board.engines.states) == [0, 1]
        assert set(board.engines.states.values()) == {"alive"}
        grad_bytes = {16 * 4 * 4, 4 * 4}  # weight and bias gradients, float32
        assert grad_bytes <= {r.nbytes for r in data.collectives}
        assert all(set(r.replicas) == {0, 1} for r in data.collectives)
        curves = board.training.curves["loss"]
        assert sorted(curves) == [0, 1] and all(len(xs) == 5 for xs, _ in curves.values())
        assert curves[0][1] != curves[1][1]  # different data: different losses ...
        # ... and the replica check after the cell found the parameters identical: no
        # "diverge" anywhere (the check, not the losses, decides)
        assert data.replica_check is not None and data.replica_check.identical
        assert "replicas identical" in board.line.value
        assert "diverge" not in board.line.value
        for replica in (0, 1):
            held = sum(r["bytes"] for r in data.holdings[replica] if r["kind"] == "parameters")
            assert held == (16 * 4 + 4) * 4
        assert len(data.steps) == 10  # 5 steps on each engine
        # the cell's start, marked on each engine's timeline while the cell ran
        for replica in (0, 1):
            at, label = data.marks[replica][-1]
            assert label.startswith("cell ") and before - 0.05 <= at <= after + 0.05
        assert len(board.reductions._panels.cells.get_segments()) == 2
    finally:
        board.close()


def test_dashboard_updates_while_a_distribute_cell_runs(dist_shell, tmp_path):
    """The refresher thread shows the engines' records while the cell still runs. The cell
    runs until a flag file exists (120 s at most); a watcher creates it once the dashboard
    showed new collectives (or after 90 s), so a loaded machine, where one refresh can take
    seconds, gets the time it needs and an idle one finishes in a few seconds."""
    flag = tmp_path / "stop"
    board = nd.dashboard()
    board.interval = 0.2
    pace = threading.Event()  # never set: a timed pause between looks

    def watch() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(
            h[3] and h[1] > len(before) and h[2] > 0 for h in list(board.history)
        ):
            pace.wait(0.1)
        flag.write_text("stop\n")

    try:
        before = board.refresh().collectives
        watcher = threading.Thread(target=watch)
        started = time.monotonic()
        watcher.start()
        dist_shell.run_cell_magic(
            "distribute",
            "",
            "import os, time\n"
            "ones = torch.ones(256)\n"
            "end = time.monotonic() + 120\n"
            "for i in range(100_000):\n"
            f"    done = float(os.path.exists({str(flag)!r}) or time.monotonic() > end)\n"
            "    strategy.run(lambda: nd.get_replica_context().all_reduce('sum', ones))\n"
            "    nd.log(step=100 + i, live=float(i))\n"
            "    if strategy.run(lambda: nd.get_replica_context().all_reduce(\n"
            "            'max', torch.tensor(done))).item():\n"
            "        break\n"
            "    time.sleep(0.05)\n",
        )
        ended = time.monotonic()
        watcher.join(timeout=120)
        during = [h for h in board.history if started < h[0] < ended and h[3]]
        # The reduction chart grew while the cell ran (records sent from the engines live).
        assert any(h[1] > len(before) for h in during), list(board.history)
        assert any(h[2] > 0 for h in during)
    finally:
        flag.write_text("stop\n")
        board.close()


def test_killed_engine_is_marked_dead_and_the_view_keeps_working(dist_shell):
    dist_shell.run_cell_magic(  # something to show, whichever tests ran before
        "distribute", "", "strategy.run(lambda: nd.get_replica_context().all_reduce('sum', "
        "torch.ones(4)))"
    )
    board = nd.dashboard()
    try:
        cluster = board.source.cluster
        victim = next(e for e in cluster.engines if e.rank == 1)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + 30
        while board.engines.states.get(1) != "dead" and time.monotonic() < deadline:
            board._stop.wait(0.1)  # the refresher thread marks it
        assert board.engines.states.get(1) == "dead", board.engines.widget.value
        assert board.engines.states.get(0) in ("alive", "busy")
        shown = board.engines.widget.value
        assert "dead" in shown and "%dist restart" in shown
        board.refresh()  # still works
        assert board.data.collectives  # what was pulled before stays shown
        result = dist_shell.run_cell("%%distribute\n1 + 1")
        assert result.error_in_exec is not None
        assert "1" in str(result.error_in_exec)
    finally:
        board.close()


def test_stop_leaves_each_dashboard_as_its_last_picture(dist_shell):
    """`%dist stop` freezes the dashboard `%dist dashboard` opened; one opened with
    `nd.dashboard()` freezes itself once it sees its cluster stopped (after the cell). Runs
    last: it stops the module's cluster."""
    from nbdist.magics import current_cluster

    if any(row.state == "dead" for row in current_cluster().status()):
        dist_shell.run_line_magic("dist", "restart")  # the test before killed an engine
    dist_shell.run_cell_magic("distribute", "", TRAIN)
    dist_shell.run_line_magic("dist", "dashboard")
    magics = dist_shell.magics_manager.registry["DistMagics"]
    opened, other = magics.board, nd.dashboard()
    cluster = current_cluster()
    try:
        assert opened.data.collectives and other.data.collectives
        dist_shell.run_cell("%dist stop")
        assert not cluster.running
        for board in (opened, other):
            assert board.frozen
            header, picture = board.children
            assert "stopped at" in header.value
            assert picture.value[:4] == b"\x89PNG" and len(picture.value) > 20_000
            assert not board._thread.is_alive()
    finally:
        other.close()
        opened.close()
