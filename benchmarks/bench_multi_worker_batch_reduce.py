"""Multi-worker `extended.batch_reduce_to` of 200 tensors vs 200 `extended.reduce_to` calls.

Setup: 2 worker processes (torchrun variables, `nd.MultiWorkerMirroredStrategy()`, one CPU
replica and one torch thread each); on each, 200 float32 tensors of 4096 elements (16 KiB),
worker `r` holding `r + 1 + i / 1000` in tensor `i`. Variants, interleaved block by block in
the same processes and group:

- `batch_reduce_to`: `strategy.extended.batch_reduce_to("sum", [(v, v) for v in values])`
  (one checked all-reduce for the whole batch);
- `200 x reduce_to`: `[strategy.extended.reduce_to("sum", v, v) for v in values]` (a checked
  all-reduce each).

Results are checked against the expected sums once before timing. Reported ratio: time of the
200 separate calls / time of one batched call (target >= 10x). For reference, a raw
`torch.distributed.all_reduce` of one 16 KiB tensor is timed alongside (x 200: what 200
separate raw collectives would cost at the very least).

Run: `python benchmarks/bench_multi_worker_batch_reduce.py [--quick]`.
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
    ratio_table,
    summarize,
    summary_row,
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

NAME = "multi_worker_batch_reduce"
COUNT = 200
ELEMENTS = 4096  # 16 KiB of float32
TARGET = 10.0
TRIALS = 12


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: time both variants (and a raw 16 KiB all_reduce); return the samples."""
    worker_setup()
    import torch
    import torch.distributed as dist

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 2
    strategy.extended.telemetry.enabled = False  # measured separately (bench_telemetry)
    extended = strategy.extended
    rank = dist.get_rank()
    values = [torch.full((ELEMENTS,), rank + 1 + i / 1000) for i in range(COUNT)]
    pairs = [(v, v) for v in values]

    # Correctness once: the sum of both workers' tensors, 3 + 2 i / 1000, from both paths.
    expected = [torch.full((ELEMENTS,), 3 + 2 * (i / 1000)) for i in range(COUNT)]
    batched = extended.batch_reduce_to("sum", pairs)
    separate = [extended.reduce_to("sum", v, v) for v in values]
    for b, s, e in zip(batched, separate, expected):
        torch.testing.assert_close(b, e)
        torch.testing.assert_close(s, e)

    def batch() -> None:
        extended.batch_reduce_to("sum", pairs)

    def loop() -> None:
        for v in values:
            extended.reduce_to("sum", v, v)

    scratch = torch.zeros(ELEMENTS)
    samples = {}
    samples.update(
        lockstep(
            {"batch_reduce_to": batch, "200 x reduce_to": loop},
            trials=params["trials"], inner=1, barrier=dist.barrier,
        )
    )  # fmt: skip
    samples.update(
        lockstep(
            {"raw all_reduce 16 KiB (one)": lambda: dist.all_reduce(scratch)},
            trials=params["trials"], inner=20, barrier=dist.barrier,
        )
    )  # fmt: skip
    strategy.shutdown()
    return {"samples": samples}


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=150.0, timeout_help="seconds for the workers"
    )
    trials = 3 if args.quick else TRIALS
    ranks = launch("bench_multi_worker_batch_reduce", {"trials": trials}, timeout=args.timeout)
    samples = ranks[0]["samples"]
    batch, loop = samples["batch_reduce_to"], samples["200 x reduce_to"]
    raw = samples["raw all_reduce 16 KiB (one)"]
    of_medians = median(loop) / median(batch)
    paired = median(paired_ratios(loop, batch))
    rank1 = ranks[1]["samples"]
    rank1_ratio = median(rank1["200 x reduce_to"]) / median(rank1["batch_reduce_to"])

    print(f"== {NAME}: {COUNT} tensors x 16 KiB float32 per worker, 2 gloo workers")
    print(machine_line(env, f", trials {trials}"))
    rows = [
        [*summary_row(name, summarize(s)), fmt_time(median(s) / (1 if "one" in name else COUNT))]
        for name, s in samples.items()
    ]
    print(table(["variant", "median", "IQR", "min", "per tensor"], rows))
    print()
    print(
        ratio_table([
            ["200 x reduce_to / batch_reduce_to", of_medians, paired],
            ["200 x reduce_to / (200 x raw all_reduce)", median(loop) / (COUNT * median(raw)),
             median(loop) / (COUNT * median(raw))],
        ])
    )  # fmt: skip
    print(f"rank 1: 200 x reduce_to / batch_reduce_to = {rank1_ratio:.2f}x\n")
    checks = [
        check("batch_reduce_to speedup over 200 reduce_to (2 workers)", of_medians, ">=",
              TARGET, cross_check=paired),
    ]  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "2 workers: 200 x reduce_to time / one batch_reduce_to time",
            "environment": env,
            "parameters": {"count": COUNT, "elements": ELEMENTS, "dtype": "float32",
                           "workers": 2, "backend": "gloo", "trials": trials},
            "variants": rank_summaries(samples),
            "rank1_variants": rank_summaries(rank1),
            "ratios": {"separate_over_batch_of_medians": of_medians,
                       "separate_over_batch_paired": paired,
                       "separate_over_batch_rank1_of_medians": rank1_ratio},
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
