"""Agreed layouts (Note [Agreed layouts] in nbdist/collectives/agreed.py): once every worker has
passed the shape check for an all-reduce, repeats of it run as one collective, and any change on
any worker, after any history, still raises the same `CollectiveMismatchError` on every worker.
2 real gloo workers.
"""

from __future__ import annotations

import re

import pytest

from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

pytestmark = pytest.mark.dist

CODE = r"""
import time
import torch
torch.set_num_threads(1)
import nbdist as nd
from nbdist.collectives.agreed import AgreedLayouts

Options = nd.experimental.CommunicationOptions
strategy = nd.MultiWorkerMirroredStrategy(communication_options=Options(timeout_seconds=20))
rank = strategy.cluster_resolver.task_id
group = strategy._group
ctx = nd.get_replica_context


def attempt(fn):
    started = time.monotonic()
    try:
        return {"result": fn()}
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error),
                "elapsed": time.monotonic() - started}


def reduce(op, value):
    return strategy.run(lambda: ctx().all_reduce(op, value))


def warm(op="sum", size=3, times=3):
    for _ in range(times):
        reduce(op, torch.ones(size))


def collectives(fn):
    before = group.entered
    fn()
    return group.entered - before


out = {}
# Values on the agreed path: every op, small and 1 MiB, ints, and several tensors at once.
r = float(rank + 1)
out["values"] = []
for _ in range(3):
    out["values"].append([
        reduce("sum", torch.full((3,), r)).tolist(),
        reduce("mean", torch.full((3,), r)).tolist(),
        reduce("max", torch.full((3,), r)).tolist(),
        reduce("min", torch.full((3,), r)).tolist(),
        reduce("sum", torch.full((2,), rank + 1, dtype=torch.int64)).tolist(),
        float(reduce("sum", torch.full((262144,), r)).sum()),
        [t.tolist() for t in reduce("sum", [torch.full((2,), r), torch.full((1,), 2 * r)])],
        reduce("sum", torch.full((2, 2), r)).tolist(),
        torch.view_as_real(reduce("sum", torch.full((2,), r * 1j, dtype=torch.complex64))).tolist(),
        reduce("sum", torch.full((3,), r, requires_grad=True)).tolist(),
        strategy.run(lambda: ctx().all_reduce("sum", torch.full((3,), r),
                                              options=Options(timeout_seconds=5))).tolist(),
        # trailers read through a memoryview (uint8, int32, float64) or with .tolist()
        # (float16, bfloat16): Note [Trailers after the wait]
        reduce("max", torch.full((2,), rank + 1, dtype=torch.uint8)).tolist(),
        reduce("min", torch.full((2,), rank + 1, dtype=torch.int32)).tolist(),
        reduce("mean", torch.full((2,), r, dtype=torch.float64)).tolist(),
        reduce("sum", torch.full((2,), r, dtype=torch.float16)).tolist(),
        reduce("max", torch.full((2, 1), r, dtype=torch.bfloat16)).tolist(),
    ])
# Steady state: one collective per call, small or large, for a repeating pattern A, B, A, B.
warm()
out["collectives_small"] = collectives(lambda: reduce("sum", torch.ones(3)))
out["collectives_large"] = [collectives(lambda: reduce("sum", torch.ones(262144)))
                            for _ in range(3)][-1]
for _ in range(3):
    reduce("sum", torch.ones(5))
    reduce("max", torch.ones(7))
out["collectives_alternating"] = [collectives(lambda: reduce("sum", torch.ones(5))),
                                  collectives(lambda: reduce("max", torch.ones(7)))]
# Mismatches after an agreed history: the same error on both workers, and the group recovers.
cases = {
    "shapes": lambda: reduce("sum", torch.ones(3 + rank)),
    "ops": lambda: reduce("max" if rank else "sum", torch.ones(3)),
    "dtypes": lambda: reduce("sum", torch.ones(3, dtype=torch.float64 if rank else torch.float32)),
    "structure": lambda: reduce("sum", [torch.ones(3)] * (rank + 1)),
    "kinds": lambda: strategy.run(lambda: ctx().all_gather(torch.ones(3), 0) if rank
                                  else ctx().all_reduce("sum", torch.ones(3))),
    "bool": lambda: reduce("max", torch.ones(3, dtype=torch.bool if rank else torch.float32)),
    "large": lambda: reduce("sum", torch.ones(262144 + rank)),
}
for name, call in cases.items():
    warm(size=262144 if name == "large" else 3)
    out[name] = attempt(call)
    out[name + "_after"] = reduce("sum", torch.tensor([r])).tolist()
# A group formed again (what a cluster restart does) reduces on the new process group, on the
# checked path and then the hot path (it holds the default group: Note [Prepared layouts]).
import torch.distributed as dist
warm()
old_world = dist.group.WORLD
group.reform("agreed-reformed")
out["reformed"] = [reduce("sum", torch.full((3,), r)).tolist() for _ in range(3)]
out["reformed_large"] = float(reduce("sum", torch.full((262144,), r)).sum())
out["reformed_world"] = [group._world is dist.group.WORLD, dist.group.WORLD is not old_world]
strategy.shutdown()
out["released_world"] = group._world is None
report(out)
"""


@pytest.fixture(scope="module")
def outputs(launch_once) -> list[dict]:
    port = free_port()
    envs = [torchrun_env(rank, 2, port) for rank in range(2)]
    results = launch_once("agreed-layouts", lambda: run_workers(CODE, envs, timeout=120))
    assert_all_ok(results)
    return [result.result for result in results]


def test_agreed_path_gives_the_same_values_as_the_checked_path(outputs):
    for out in outputs:
        first = out["values"][0]
        assert first[:5] == [[3.0] * 3, [1.5] * 3, [2.0] * 3, [1.0] * 3, [3, 3]]
        assert first[5] == 3.0 * 262144
        assert first[6] == [[3.0, 3.0], [6.0]]
        # the hot path's edges: a 2-d tensor, a complex one (torch.distributed's own wrapper
        # views it as real pairs), one that requires grad, a per-call timeout
        assert first[7:11] == [[[3.0] * 2] * 2, [[0.0, 3.0]] * 2, [3.0] * 3, [3.0] * 3]
        assert first[11:] == [[2, 2], [1, 1], [1.5, 1.5], [3.0, 3.0], [[2.0], [2.0]]]
        assert out["values"][1] == first and out["values"][2] == first


def test_a_group_formed_again_reduces_on_its_new_process_group(outputs):
    for out in outputs:
        assert out["reformed"] == [[3.0] * 3] * 3
        assert out["reformed_large"] == 3.0 * 262144
        assert out["reformed_world"] == [True, True]
        assert out["released_world"]  # shutdown lets torch.distributed alone own the group


def test_repeated_all_reduces_cost_one_collective(outputs):
    for out in outputs:
        assert out["collectives_small"] == 1
        assert out["collectives_large"] == 1
        assert out["collectives_alternating"] == [1, 1]


MESSAGES = {
    "shapes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(4,\) float32"],
    "ops": [r"rank 0: all_reduce:SUM", r"rank 1: all_reduce:MAX"],
    "dtypes": [r"rank 0: .*\(3,\) float32", r"rank 1: .*\(3,\) float64"],
    "structure": [r"rank 0: .*of 1 tensor", r"rank 1: .*of 2 tensor"],
    "kinds": [r"rank 0: all_reduce:SUM", r"rank 1: all_gather:0"],
    "bool": [r"rank 0: .*float32", r"rank 1: .*bool"],
    "large": [r"rank 0: .*\(262144,\) float32", r"rank 1: .*\(262145,\) float32"],
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_a_change_after_an_agreed_history_raises_on_every_worker(outputs, case):
    for out in outputs:
        error = out[case]
        assert error.get("type") == "CollectiveMismatchError", error
        for pattern in MESSAGES[case]:
            assert re.search(pattern, error["message"]), (pattern, error["message"])
        assert error["elapsed"] < 10  # found by the check, not by a timeout
        assert out[case + "_after"] == [3.0]  # and the group is still usable
