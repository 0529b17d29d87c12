"""Multi-worker `ReplicaContext.all_reduce` vs raw `torch.distributed.all_reduce`, 2 gloo workers.

Setup: 2 worker processes (torchrun variables, `nd.MultiWorkerMirroredStrategy()`, one CPU
replica and one torch thread each). In the same processes and the same process group, for
float32 tensors of 4 KiB ... 64 MiB (powers of 4), two variants are interleaved block by block:

- `nbdist`: `strategy.run(lambda t: nd.get_replica_context().all_reduce("sum", t), args=(t,))`
  (returns a new tensor: nbdist copies the input before reducing);
- `raw` (the anchor): `torch.distributed.all_reduce(t)`, in place.

Both sides reduce tensors of zeros (the values stay finite and constant).

nbdist checks that all ranks call the same collective with the same shapes and dtypes: the
first call of a layout exchanges a signature row (Note [Checked collectives] in
nbdist/collectives/torch_dist.py); repeats ride in the all-reduce itself as one trailing element
(Note [Agreed layouts] in nbdist/collectives/agreed.py). For reference, a variant
`raw all_gather 512 B` does the gather a first-time check does. And since
nbdist returns a new tensor (the input is left alone), a third anchor `raw, on a copy` runs
`dist.all_reduce(t.clone())` at every size: what a user who needs the input kept would write
(the fresh allocation page-faults, which costs a lot at 64 MiB). Reported: throughput ratio raw
time / nbdist time per size (target >= 0.95 from 1 MiB up; `copy/nbdist` is the same against
the on-a-copy anchor, for information) and the latency ratio nbdist / raw at 4 KiB (target
<= 1.15x).

Run: `python benchmarks/bench_multi_worker_allreduce.py [--quick]`.
"""

from __future__ import annotations

import sys
from typing import Any

from _common import (
    check,
    finish,
    fmt_time,
    median,
    paired_ratios,
    table,
)
from bench_multi_worker_common import (
    launch,
    lockstep,
    machine_line,
    parse_multi_worker_args,
    rank_summaries,
    worker_setup,
)

NAME = "multi_worker_allreduce"
KIB = 1024
SIZES = [4 * KIB * 4**k for k in range(8)]  # 4 KiB ... 64 MiB
# (calls per timed block, trials) per size: blocks of ~20-150 ms, ~60 s in all.
PLAN = {
    4 * KIB: (16, 24), 16 * KIB: (16, 24), 64 * KIB: (12, 24), 256 * KIB: (8, 24),
    1024 * KIB: (6, 24), 4096 * KIB: (3, 20), 16384 * KIB: (1, 20), 65536 * KIB: (1, 8),
}  # fmt: skip
THROUGHPUT_TARGET = 0.95
LATENCY_TARGET = 1.15
SIGNATURE_INT64 = 64  # nbdist's signature row (torch_dist._SIGNATURE_WIDTH)


def _label(nbytes: int) -> str:
    return f"{nbytes // (1024 * KIB)} MiB" if nbytes >= 1024 * KIB else f"{nbytes // KIB} KiB"


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: time both variants at every size; return the samples."""
    worker_setup()
    import torch
    import torch.distributed as dist

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 2 and strategy.process_group_backend == "gloo"
    strategy.extended.telemetry.enabled = False  # measured separately (bench_telemetry)

    def reduce_step(t: torch.Tensor) -> torch.Tensor:
        return nd.get_replica_context().all_reduce("sum", t)

    # Correctness once: rank r sends r + 1, both get 3.
    ones = torch.full((1024,), float(dist.get_rank() + 1))
    assert torch.equal(strategy.run(reduce_step, args=(ones,)), torch.full((1024,), 3.0))

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out: dict[str, Any] = {"samples": {}}
    for nbytes in params["sizes"]:
        inner, trials = params["plan"][str(nbytes)]
        tensor = torch.zeros(nbytes // 4)
        variants = {
            "nbdist": lambda t=tensor: strategy.run(reduce_step, args=(t,)),
            "raw": lambda t=tensor: dist.all_reduce(t),
            "raw, on a copy": lambda t=tensor: dist.all_reduce(t.clone()),
        }
        if nbytes == SIZES[0]:
            row = torch.zeros(SIGNATURE_INT64, dtype=torch.int64)
            rows = torch.zeros(2 * SIGNATURE_INT64, dtype=torch.int64)
            variants["raw all_gather 512 B"] = lambda r=row, o=rows: gather(o, r)
        out["samples"][str(nbytes)] = lockstep(
            variants, trials=trials, inner=inner, barrier=dist.barrier
        )
    strategy.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=240.0, timeout_help="seconds for the workers"
    )
    plan = {str(size): [inner, 4 if args.quick else trials] for size, (inner, trials)
            in PLAN.items()}  # fmt: skip
    ranks = launch(
        "bench_multi_worker_allreduce", {"sizes": SIZES, "plan": plan}, timeout=args.timeout
    )
    per_rank = [r["samples"] for r in ranks]
    primary = per_rank[0]

    print(f"== {NAME}: 2 gloo worker processes, 1 CPU replica and 1 torch thread each")
    print(machine_line(env))
    rows, ratios, stats = [], {}, {}
    for nbytes in SIZES:
        samples = primary[str(nbytes)]
        nb, raw, copy = samples["nbdist"], samples["raw"], samples["raw, on a copy"]
        of_medians = median(raw) / median(nb)
        paired = median(paired_ratios(raw, nb))
        rank1 = per_rank[1][str(nbytes)]
        rank1_ratio = median(rank1["raw"]) / median(rank1["nbdist"])
        ratios[str(nbytes)] = {
            "throughput_ratio_of_medians": of_medians,
            "throughput_ratio_paired": paired,
            "throughput_ratio_rank1_of_medians": rank1_ratio,
            "raw_on_copy_over_nbdist_of_medians": median(copy) / median(nb),
            "latency_ratio_of_medians": median(nb) / median(raw),
        }
        stats[str(nbytes)] = rank_summaries(samples)
        stats[str(nbytes)]["rank1"] = rank_summaries(rank1)
        rows.append([
            _label(nbytes), fmt_time(median(nb)), fmt_time(median(raw)),
            f"{nbytes / median(nb) / 1e9:.2f}", f"{nbytes / median(raw) / 1e9:.2f}",
            fmt_time(median(copy)), fmt_time(median(nb) - median(raw)),
            f"{of_medians:.3f}", f"{paired:.3f}", f"{rank1_ratio:.3f}",
            f"{median(copy) / median(nb):.3f}",
        ])  # fmt: skip
    print(
        table(
            ["size", "nbdist", "raw", "nbdist GB/s", "raw GB/s", "raw on copy", "nbdist - raw",
             "raw/nbdist", "paired", "rank 1", "copy/nbdist"],
            rows,
        )
    )  # fmt: skip
    small = primary[str(SIZES[0])]
    gather = median(small["raw all_gather 512 B"])
    print(
        f"\nat 4 KiB: raw all_reduce {fmt_time(median(small['raw']))}, the check's all_gather "
        f"of 512 B alone {fmt_time(gather)}, nbdist {fmt_time(median(small['nbdist']))} "
        f"(~ raw + gather: {fmt_time(median(small['raw']) + gather)})\n"
    )
    latency = median(small["nbdist"]) / median(small["raw"])
    latency_paired = median(paired_ratios(small["nbdist"], small["raw"]))
    checks = [
        check("latency nbdist / raw at 4 KiB", latency, "<=", LATENCY_TARGET,
              cross_check=latency_paired,
              note="includes the signature all_gather nbdist runs before every collective"),
    ]  # fmt: skip
    for nbytes in SIZES:
        if nbytes >= 1024 * KIB:
            r = ratios[str(nbytes)]
            checks.append(
                check(f"throughput nbdist / raw at {_label(nbytes)}",
                      r["throughput_ratio_of_medians"], ">=", THROUGHPUT_TARGET,
                      cross_check=r["throughput_ratio_paired"])
            )  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "2-worker nbdist all_reduce in strategy.run vs raw dist.all_reduce",
            "environment": env,
            "parameters": {"sizes_bytes": SIZES, "plan": plan, "dtype": "float32",
                           "workers": 2, "backend": "gloo", "threads_per_worker": 1},
            "variants": stats,
            "ratios": ratios,
            "signature_all_gather_s": gather,
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
