"""Worker script of tests/dist/test_gather_buffers.py (`CODE`)."""

import time
from datetime import timedelta

import torch

import nbdist as nd
from tests.dist.workers._prelude import start

if "report" not in globals():  # run_workers predefines it (a test may pass its own)
    from nbdist.testing import report


if __name__ == "__main__":
    from nbdist.collectives import agreed
    from nbdist.collectives.direct import MAX_BUFFER_BYTES
    from nbdist.core.reduce.op import ReduceOp

    strategy, rank = start(timeout_seconds=4)
    group = strategy._group
    ctx = nd.get_replica_context


    def reduce(value, op="sum"):
        return strategy.run(lambda: ctx().all_reduce(op, value))


    def buffers_of(shape, op=ReduceOp.SUM):
        prepared = group._prepared.get(agreed.layout_key(op, [torch.zeros(shape)]))
        return prepared.buffers if prepared else None


    out = {}
    # A layout used a few times: checked, then agreed, then on the hot path with its buffers.
    for _ in range(3):
        reduce(torch.zeros(1000))
    buffers = buffers_of((1000,))
    out["kept"] = buffers is not None
    first = reduce(torch.full((1000,), float(rank + 1)))
    second = reduce(torch.full((1000,), 10.0))
    out["first_after_second"] = first.unique().tolist()  # 1 + 2, untouched by the second call
    out["second"] = second.unique().tolist()
    storages = {b.untyped_storage().data_ptr() for b in (buffers.send, buffers.rows)}
    out["results_share_no_buffer"] = all(
        r.untyped_storage().data_ptr() not in storages for r in (first, second)
    )
    first.add_(100.0)  # a user writing into a result changes nothing the next call sees
    out["after_user_write"] = reduce(torch.full((1000,), float(rank))).unique().tolist()
    out["rows_hold_last_inputs"] = [p.unique().tolist() for p in buffers.parts]

    # Several shapes and ops on the hot path.
    grid = torch.arange(200.0).reshape(10, 20) * (rank + 1)
    for _ in range(3):
        last = reduce(grid, "max")
    out["grid"] = [list(last.shape), torch.equal(last, torch.arange(200.0).reshape(10, 20) * 2)]
    out["grid_kept"] = buffers_of((10, 20), ReduceOp.MAX) is not None
    for _ in range(3):
        ints = reduce(torch.tensor([rank, 7], dtype=torch.int32), "mean")
    out["int_mean"] = [str(ints.dtype), ints.tolist()]

    # First used inside inference mode, then outside it.
    with torch.inference_mode():
        inside = [reduce(torch.ones(333)).sum().item() for _ in range(3)]
    outside = [reduce(torch.ones(333, requires_grad=True)).sum().item() for _ in range(3)]
    out["inference"] = [inside, outside, buffers_of((333,)).send.is_inference()]

    # A call that finds the buffers taken (another thread inside) makes its own.
    for _ in range(3):  # until 1000 follows 1000 (Note [Agreed layouts]), then on the hot path
        reduce(torch.full((1000,), -1.0))
    if rank == 0:
        buffers.free.acquire()
    before = group.entered
    taken = reduce(torch.full((1000,), 5.0 * (rank + 1)))
    out["while_taken"] = [taken.unique().tolist(), group.entered - before]
    out["rows_while_taken"] = [p.unique().tolist() for p in buffers.parts]
    if rank == 0:
        buffers.free.release()
    again = reduce(torch.full((1000,), 2.0))
    out["after_release"] = [again.unique().tolist(), buffers.parts[1].unique().tolist()]

    # The byte budget of the buffers kept.
    out["budget"] = [group._buffer_bytes <= MAX_BUFFER_BYTES, sum(
        p.buffers.nbytes for p in group._prepared.values() if p and p.buffers is not None
    ) <= group._buffer_bytes]

    # A hot-path collective that fails (rank 1 never calls it) drops its layout's buffers.
    def lonely():
        if rank == 1:
            return None
        return ctx().all_reduce("sum", torch.ones(1000))

    started = time.monotonic()
    try:
        strategy.run(lonely)
        out["failure"] = "returned"
    except Exception as error:
        out["failure"] = type(error).__name__
    out["failure_elapsed"] = time.monotonic() - started
    out["dropped"] = buffers_of((1000,)) is None if rank == 0 else None
    # Rank 1 stays in the group until rank 0's collective has timed out.
    group._store.set(f"gather-buffers-done/{rank}", "1")
    group._store.wait([f"gather-buffers-done/{1 - rank}"], timedelta(seconds=60))
    strategy.shutdown()
    report(out)
