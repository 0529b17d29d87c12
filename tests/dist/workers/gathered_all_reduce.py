"""Worker script of tests/dist/test_gathered_all_reduce.py (`CODE`)."""

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    from nbdist.collectives import agreed
    from nbdist.core.reduce.op import ReduceOp

    strategy, rank = start()
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
            pair = strategy.run(  # called at once, in this iteration
                lambda: ctx().all_reduce(name, [values(rank, n), values(rank, 7)])  # noqa: B023
            )
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
