"""`extended.batch_reduce_to` of 200 small tensors vs 200 separate `extended.reduce_to` calls.

Setup: `MirroredStrategy(["cpu:0", "cpu:1"])`; a PerReplica of 200 float32 tensors of 4096
elements (16 KiB) per replica; destination a MirroredVariable made in `scope()` (also measured:
the device list `extended.worker_devices`). Target (from the issue): the batched call is at least
5x faster than the loop of separate calls.

Two pure-torch anchors show the floor of the tensor work alone: `torch_separate` does what the
separate path computes (200 adds and 200 clones of 16 KiB), `torch_packed` what the batched path
computes (two cats, one add, one clone, two splits into 200 views).

Run: `python benchmarks/bench_batch_reduce.py [--quick]`.
"""

from __future__ import annotations

import sys

import torch
from _common import (
    benchmark_parser,
    check,
    finish,
    fmt_time,
    interleaved,
    median,
    paired_ratios,
    parse_in_process_args,
    ratio_table,
    summarize,
    summary_row,
    table,
)

import nbdist as nd

NAME = "batch_reduce"
COUNT = 200
ELEMENTS = 4096  # 16 KiB of float32
TARGET = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--inner", type=int, default=3, help="calls per timed block")
    args, env = parse_in_process_args(parser, argv, quick={"trials": 6, "inner": 1})

    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    extended = strategy.extended
    with strategy.scope():
        dest_var = nd.Variable(torch.zeros(ELEMENTS))
    dest_devices = extended.worker_devices

    generator = torch.Generator().manual_seed(0)
    per_replica_tensors = [
        [torch.randn(ELEMENTS, generator=generator) for _ in range(2)] for _ in range(COUNT)
    ]
    values = [
        strategy.experimental_distribute_values_from_function(
            lambda ctx, pair=pair: pair[ctx.replica_id_in_sync_group]
        )
        for pair in per_replica_tensors
    ]
    pairs_var = [(v, dest_var) for v in values]
    pairs_devices = [(v, dest_devices) for v in values]

    # Correctness once, outside the timing: both paths give the same sums on both devices.
    batched = extended.batch_reduce_to("sum", pairs_var)
    separate = [extended.reduce_to("sum", v, dest_var) for v in values]
    for b, s, (x, y) in zip(batched, separate, per_replica_tensors):
        expected = x + y
        for component in (*b.values, *s.values):
            torch.testing.assert_close(component, expected)

    def batch_var() -> None:
        extended.batch_reduce_to("sum", pairs_var)

    def separate_var() -> None:
        for v in values:
            extended.reduce_to("sum", v, dest_var)

    def batch_devices() -> None:
        extended.batch_reduce_to("sum", pairs_devices)

    def separate_devices() -> None:
        for v in values:
            extended.reduce_to("sum", v, dest_devices)

    def torch_separate() -> None:
        for x, y in per_replica_tensors:
            total = torch.add(x, y)
            total.clone()

    sizes = [ELEMENTS] * COUNT

    def torch_packed() -> None:
        flat0 = torch.cat([x for x, _ in per_replica_tensors])
        flat1 = torch.cat([y for _, y in per_replica_tensors])
        total = torch.add(flat0, flat1)
        copy = total.clone()
        for flat in (total, copy):
            for piece in torch.split(flat, sizes):
                piece.view(ELEMENTS)

    variants = {
        "batch_reduce_to (MirroredVariable)": batch_var,
        "200 x reduce_to (MirroredVariable)": separate_var,
        "batch_reduce_to (device list)": batch_devices,
        "200 x reduce_to (device list)": separate_devices,
        "torch_separate (anchor: 200 add+clone)": torch_separate,
        "torch_packed (anchor: cat+add+clone+split)": torch_packed,
    }
    # Telemetry stays on (the default, as a user has it); its log is bounded (10 000 records).
    extended.telemetry.clear()
    samples = interleaved(variants, trials=args.trials, inner=args.inner)
    extended.telemetry.clear()

    stats = {name: summarize(s) for name, s in samples.items()}
    names = list(variants)
    var_ratio = median(paired_ratios(samples[names[1]], samples[names[0]]))
    dev_ratio = median(paired_ratios(samples[names[3]], samples[names[2]]))
    var_ratio_of_medians = stats[names[1]]["median_s"] / stats[names[0]]["median_s"]
    dev_ratio_of_medians = stats[names[3]]["median_s"] / stats[names[2]]["median_s"]
    batch_over_floor = median(paired_ratios(samples[names[0]], samples[names[5]]))
    separate_over_floor = median(paired_ratios(samples[names[1]], samples[names[4]]))
    batch_over_floor_of_medians = stats[names[0]]["median_s"] / stats[names[5]]["median_s"]
    separate_over_floor_of_medians = stats[names[1]]["median_s"] / stats[names[4]]["median_s"]

    kib = ELEMENTS * 4 // 1024
    print(f"== {NAME}: {COUNT} tensors x {kib} KiB float32 per replica, 2 replicas")
    print(
        f"torch threads {env['torch_num_threads']}, cpu_count {env['cpu_count']}, "
        f"trials {args.trials} x {args.inner} calls, load {env['loadavg_at_start']}"
    )
    rows = [
        [*summary_row(name, st), fmt_time(st["median_s"] / COUNT)] for name, st in stats.items()
    ]
    print(table(["variant", "median", "IQR", "min", "per tensor"], rows))
    print()
    ratio_rows = [
        ["separate / batch (MirroredVariable)", var_ratio_of_medians, var_ratio],
        ["separate / batch (device list)", dev_ratio_of_medians, dev_ratio],
        ["batch / torch_packed anchor", batch_over_floor_of_medians, batch_over_floor],
        ["separate / torch_separate anchor", separate_over_floor_of_medians, separate_over_floor],
    ]
    print(ratio_table(ratio_rows))
    print()
    checks = [
        check("batch_reduce speedup (MirroredVariable dest)", var_ratio_of_medians, ">=", TARGET,
              cross_check=var_ratio),
        check("batch_reduce speedup (device-list dest)", dev_ratio_of_medians, ">=", TARGET,
              cross_check=dev_ratio),
    ]  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "separate reduce_to loop time / one batch_reduce_to time",
            "environment": env,
            "parameters": {
                "count": COUNT, "elements": ELEMENTS, "dtype": "float32", "replicas": 2,
                "trials": args.trials, "inner": args.inner,
            },
            "variants": stats,
            "ratios": {
                "separate_over_batch_var_paired": var_ratio,
                "separate_over_batch_var_of_medians": var_ratio_of_medians,
                "separate_over_batch_devices_paired": dev_ratio,
                "separate_over_batch_devices_of_medians": dev_ratio_of_medians,
                "batch_over_torch_packed_paired": batch_over_floor,
                "batch_over_torch_packed_of_medians": batch_over_floor_of_medians,
                "separate_over_torch_separate_paired": separate_over_floor,
                "separate_over_torch_separate_of_medians": separate_over_floor_of_medians,
            },
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
