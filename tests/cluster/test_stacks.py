"""`cluster.stacks()` on 4 real engines while `cluster.strategy.run` runs: three replicas with
the same stack are printed as one group, the fourth on its own, each naming its collective."""

from __future__ import annotations

import threading
import time

import pytest

import nbdist as nd

pytestmark = pytest.mark.cluster

WAIT_S = 60.0


def _three_wait_one_sleeps():
    import time

    import torch

    import nbdist as nd

    ctx = nd.get_replica_context()
    if ctx.replica_id_in_sync_group == 3:
        time.sleep(6)  # the odd one out
    return ctx.all_reduce("sum", torch.ones(2))  # the other three wait here


@pytest.fixture(scope="module")
def cluster(start_cluster):
    return start_cluster(n=4)


def test_three_identical_stacks_print_once(cluster):
    seen: dict = {}

    def look() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            stacks = cluster.stacks()
            waiting = [s for s in stacks if s.collective and s.collective["end"] is None]
            if len(waiting) == 3 and all(s.collective["waiting_s"] > 1 for s in waiting):
                seen["stacks"] = stacks
                return
            time.sleep(0.1)

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    out = cluster.strategy.run(_three_wait_one_sleeps, timeout=WAIT_S)
    thread.join(WAIT_S)
    assert [v.tolist() for v in out.values] == [[4.0, 4.0]] * 4
    stacks = seen["stacks"]
    assert [s.replica for s in stacks] == [0, 1, 2, 3]
    assert {s.collective["seq"] for s in stacks[:3]} == {1} and stacks[3].collective is None
    view = nd.debug.format_stacks(stacks)
    assert view.count("replicas 0-2:") == 1 and view.count("replica 3 (pid ") == 1, view
    assert view.count('return ctx.all_reduce("sum", torch.ones(2))') == 1, view
    assert "time.sleep(6)  # the odd one out" in view, view
    assert f"replica 3 (pid {stacks[3].pid} on {stacks[3].host}): no collective yet; now at " in (
        view
    ), view
    assert "in _three_wait_one_sleeps" in view, view
