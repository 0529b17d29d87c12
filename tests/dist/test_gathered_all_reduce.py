"""Small agreed all-reduces run as one all-gather, combined on every rank in rank order (Note
[Small agreed all-reduces gather] in nbdist/collectives/agreed.py). 3 real gloo workers, so
that the order of a floating-point sum matters: every rank must get the same bits, and the
values of a rank-order reduction, on the hot path (one tensor) and on the other agreed path
(several tensors), while a layout too large to gather still reduces in place.
"""

from __future__ import annotations

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

pytestmark = pytest.mark.dist

WORKERS = 3

CODE = r"""
import torch
torch.set_num_threads(1)
import nbdist as nd
from nbdist.collectives import agreed
from nbdist.reduce import ReduceOp

strategy = nd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
world = strategy.num_replicas_in_sync
group = strategy._group
ctx = nd.get_replica_context


def values(r, n):
    # magnitudes 1, 1e4, 1e8: the rounding of a sum depends on its order
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + r)) * 10.0 ** (4 * r)


def reduce(op, value):
    return strategy.run(lambda: ctx().all_reduce(op, value))


def in_rank_order(op, n):
    rows = [values(r, n) for r in range(world)]
    return op.combine(rows)


out = {"gathers": {}, "bits": {}, "matches_rank_order": {}, "collectives": {}}
for n in (1000, 5000):  # 3 x 1001 x 4 bytes gathers; 3 x 5001 x 4 does not
    key = agreed.layout_key(ReduceOp.SUM, [torch.zeros(n)])
    out["gathers"][n] = agreed.gathers(agreed.plan(key, group.device), world, group.backend)
    for name in ("sum", "mean", "max", "min"):
        op = ReduceOp.from_value(name)
        results = [reduce(name, values(rank, n)) for _ in range(4)]  # checked, then agreed
        before = group.entered
        last = reduce(name, values(rank, n))
        out["collectives"][f"{n} {name}"] = group.entered - before
        pair = strategy.run(lambda: ctx().all_reduce(name, [values(rank, n), values(rank, 7)]))
        out["bits"][f"{n} {name}"] = [
            r.view(torch.int32).tolist() for r in (results[-1], last, *pair)
        ]
        if n == 1000:
            expected = in_rank_order(op, n)
            out["matches_rank_order"][name] = [
                torch.equal(r, expected) for r in (results[1], results[-1], last, pair[0])
            ]
strategy.shutdown()
report(out)
"""


@pytest.fixture(scope="module")
def outputs(launch_once) -> list[dict]:
    port = free_port()
    envs = [torchrun_env(rank, WORKERS, port) for rank in range(WORKERS)]
    results = launch_once("gathered-all-reduce", lambda: run_workers(CODE, envs, timeout=180))
    assert_all_ok(results)
    return [result.result for result in results]


def test_small_layouts_gather_and_large_ones_do_not(outputs):
    for out in outputs:
        assert out["gathers"] == {"1000": True, "5000": False}


def test_every_rank_gets_the_same_bits(outputs):
    first = outputs[0]["bits"]
    assert len(first) == 8
    for out in outputs[1:]:
        for case, bits in first.items():
            assert out["bits"][case] == bits, f"ranks differ on {case}"


def test_gathered_results_are_the_rank_order_reduction(outputs):
    for out in outputs:
        assert out["matches_rank_order"] == {
            name: [True] * 4 for name in ("sum", "mean", "max", "min")
        }


def test_an_agreed_call_costs_one_collective_gathered_or_not(outputs):
    for out in outputs:
        assert set(out["collectives"].values()) == {1}, out["collectives"]
