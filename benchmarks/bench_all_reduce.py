"""In-process `ReplicaContext.all_reduce` of 16 MiB per replica vs one `torch.add` of two.

Setup: `MirroredStrategy(["cpu:0", "cpu:1"])`, a PerReplica of two pre-allocated float32 tensors
of 4M elements (16 MiB). Variants, interleaved:

- `all_reduce run`: `s.run(lambda t: nd.get_replica_context().all_reduce("sum", t), args=(v,))`
- `identity run`: `s.run(lambda t: t, args=(v,))`, the cost of `run` itself;
- `torch.add` (the anchor): `torch.add(a, b)` of two 16 MiB tensors (allocates its output, as
  the reduction does).

Reported: raw ratio all_reduce run / add; (all_reduce run - identity run) / add, the collective
without the run overhead; and the collective's own time as nbdist's telemetry records it
(`extended.telemetry.records()[-1].duration`, first arrival to result ready) / add.
Target (from the issue): all_reduce at most 2.5x torch.add.

Torch's default intra-op thread count is kept (and reported); `--threads N` overrides it.
Run: `python benchmarks/bench_all_reduce.py [--quick]`.
"""

from __future__ import annotations

import sys

import torch
from _common import (
    benchmark_parser,
    check,
    finish,
    gc_paused,
    median,
    paired_ratios,
    parse_in_process_args,
    ratio_table,
    summarize,
    summary_row,
    table,
    time_calls,
)

import nbdist as nd

NAME = "all_reduce"
ELEMENTS = 4 * 1024 * 1024  # 16 MiB of float32
TARGET = 2.5


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--trials", type=int, default=150)
    args, env = parse_in_process_args(parser, argv, quick={"trials": 8})

    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    telemetry = strategy.extended.telemetry
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(ELEMENTS, generator=generator)
    b = torch.randn(ELEMENTS, generator=generator)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: (a, b)[ctx.replica_id_in_sync_group]
    )

    def all_reduce_step(t: torch.Tensor) -> torch.Tensor:
        return nd.get_replica_context().all_reduce("sum", t)

    def identity_step(t: torch.Tensor) -> torch.Tensor:
        return t

    def all_reduce_run() -> None:
        strategy.run(all_reduce_step, args=(value,))

    def identity_run() -> None:
        strategy.run(identity_step, args=(value,))

    def add() -> None:
        torch.add(a, b)

    # Correctness once: both replicas get a + b.
    expected = torch.add(a, b)
    for component in strategy.experimental_local_results(
        strategy.run(all_reduce_step, args=(value,))
    ):
        torch.testing.assert_close(component, expected)
    del expected

    variants = {
        "all_reduce run": all_reduce_run,
        "identity run": identity_run,
        "torch.add (anchor)": add,
    }
    names = list(variants)
    for fn in variants.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in names}
    durations: list[float] = []
    nbytes_recorded = 0
    for trial in range(args.trials):
        # Rotate the order so each variant is first, second and third equally often.
        order = names[trial % 3 :] + names[: trial % 3]
        with gc_paused(collect=trial % 10 == 0):
            for name in order:
                if name == "all_reduce run":
                    telemetry.clear()  # keeps records() (which builds every record) cheap
                samples[name].extend(time_calls(variants[name], 1))
                if name == "all_reduce run":
                    record = telemetry.records()[-1]
                    durations.append(record.duration)
                    nbytes_recorded = record.nbytes
    telemetry.clear()

    stats = {name: summarize(s) for name, s in samples.items()}
    stats["telemetry duration (collective only)"] = summarize(durations)
    ar, ident, anchor = (samples[n] for n in names)
    raw = median(paired_ratios(ar, anchor))
    isolated = median([(x - i) / d for x, i, d in zip(ar, ident, anchor)])
    collective = median(paired_ratios(durations, anchor))
    raw_of_medians = stats[names[0]]["median_s"] / stats[names[2]]["median_s"]
    isolated_of_medians = (stats[names[0]]["median_s"] - stats[names[1]]["median_s"]) / stats[
        names[2]
    ]["median_s"]
    collective_of_medians = median(durations) / stats[names[2]]["median_s"]

    print(f"== {NAME}: 2 replicas x {ELEMENTS * 4 // 2**20} MiB float32, in-process (threads)")
    print(
        f"torch threads {env['torch_num_threads']}, cpu_count {env['cpu_count']}, "
        f"trials {args.trials}, load {env['loadavg_at_start']}, "
        f"telemetry nbytes per replica {nbytes_recorded}"
    )
    rows = [summary_row(name, st) for name, st in stats.items()]
    print(table(["variant", "median", "IQR", "min"], rows))
    print()
    ratio_rows = [
        ["raw: all_reduce run / add", raw_of_medians, raw],
        ["isolated: (all_reduce run - identity run) / add", isolated_of_medians, isolated],
        ["collective: telemetry duration / add", collective_of_medians, collective],
    ]
    print(ratio_table(ratio_rows))
    print()
    checks = [
        check("all_reduce 16 MiB / torch.add (raw run)", raw_of_medians, "<=", TARGET,
              cross_check=raw),
        check("all_reduce 16 MiB / torch.add (run overhead removed)", isolated_of_medians, "<=",
              TARGET, cross_check=isolated),
        check("all_reduce 16 MiB / torch.add (telemetry duration)", collective_of_medians, "<=",
              TARGET, cross_check=collective),
    ]  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "in-process all_reduce of 16 MiB per replica relative to torch.add",
            "environment": env,
            "parameters": {
                "elements": ELEMENTS, "dtype": "float32", "replicas": 2, "trials": args.trials,
            },
            "variants": stats,
            "ratios": {
                "raw_paired": raw, "raw_of_medians": raw_of_medians,
                "isolated_paired": isolated, "isolated_of_medians": isolated_of_medians,
                "telemetry_duration_paired": collective,
                "telemetry_duration_of_medians": collective_of_medians,
            },
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
