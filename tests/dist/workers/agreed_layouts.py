"""Worker script of tests/dist/test_agreed_layouts.py (`CODE`)."""

import time

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    Options = nd.experimental.CommunicationOptions
    strategy, rank = start(timeout_seconds=20)
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
            torch.view_as_real(
                reduce("sum", torch.full((2,), r * 1j, dtype=torch.complex64))
            ).tolist(),
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
        "dtypes": lambda: reduce(
            "sum", torch.ones(3, dtype=torch.float64 if rank else torch.float32)
        ),
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
