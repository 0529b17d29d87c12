"""Collectives between processes on `torch.distributed` (gloo or NCCL): `DistGroup`, the process
group of a multi-worker strategy. With `nbdist.collectives.direct` (how an all-reduce is
started), the only modules that call torch.distributed collectives.

`DistGroup` is put together from one module per concept:

- `group`: the group: rendezvous, forming it (again: `reform`), abandoning it on every
  rank, the peers' liveness, leaving it;
- `bookkeeping`: one context for every collective: its number, telemetry, the recorder, the
  diagnosis of a failure;
- `recorder`: the last N collectives of this process (`nd.debug.compare_collectives`);
- `checked`: the signature check, all-gather, broadcast, barrier;
- `all_reduce`: the all-reduce paths, with a table of which call takes which path;
- `sharded`: FSDP2's all-gathers and reduce-scatters (`FullyShardedStrategy`).

Note [Checked collectives]: gloo aborts the process when ranks pass buffers of different sizes
and silently mixes dtypes of the same width, so every user-facing collective first exchanges a
fixed-size signature (op, shapes, dtypes) with one small `all_gather`; every rank then sees every
signature and all raise the same clear error. An all-reduce whose layout all ranks already
agreed on skips that exchange and carries the check in one trailing element (Note [Agreed
layouts] in `nbdist.collectives.agreed`). Gradient buckets skip the check: their layout is
checked once, when the model's scope exits.

Note [Naming the missing rank] and Note [Raw collectives]: see `nbdist.collectives.liveness`.

Note [A store on one address]: see `nbdist.collectives.store`.

Example (on every rank)::

    group = DistGroup(rank=r, world_size=2, master_addr="127.0.0.1", master_port=29500,
                      backend="gloo", device=torch.device("cpu"), timeout=30)
    group.all_reduce_tensor(torch.ones(3), ReduceOp.SUM)      # tensor([2., 2., 2.])
"""

from __future__ import annotations

from nbdist.collectives.all_reduce import AllReducePaths
from nbdist.collectives.checked import CheckedCollectives
from nbdist.collectives.group import GroupLifecycle
from nbdist.collectives.liveness import C10D_FILE
from nbdist.collectives.sharded import ShardedCollectives
from nbdist.collectives.store import BIND_STORE_ENV

__all__ = ["BIND_STORE_ENV", "DistGroup", "raised_in_torch_distributed"]


class DistGroup(AllReducePaths, CheckedCollectives, ShardedCollectives, GroupLifecycle):
    """The process group of a multi-worker strategy, with checked, timed, recorded collectives.

    Context: every method is a collective: every rank must call it, in the same order.
    Hangs if: never; a rank that dies, fails or never arrives is named in a `WorkerLostError` or
    `CollectiveTimeoutError` on every surviving rank within the timeout.
    """


def raised_in_torch_distributed(error: BaseException) -> bool:
    """True when `error` came out of a `torch.distributed` call (its traceback passes there)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(C10D_FILE):
            return True
        tb = tb.tb_next
    return False
