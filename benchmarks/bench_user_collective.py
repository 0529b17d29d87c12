"""A user's collective at default settings vs raw `torch.distributed`, 2 gloo workers (issue 13).

Setup: 2 worker processes (torchrun variables, `nd.MultiWorkerMirroredStrategy()` with its
defaults: telemetry on, the shape check on; one CPU replica and one torch thread each). In the
same processes and process group, for float32 tensors of 4 KiB ... 16 MiB, interleaved:

- `nbdist`: `strategy.run(lambda t: nd.get_replica_context().all_reduce("sum", t), args=(t,))`;
- `raw` (the anchor): `torch.distributed.all_reduce(t.clone())`, which leaves the input alone
  and returns a new tensor, as nbdist does.

Two timings of each:
- *call by call*: one call, timed on its own, after an untimed raw barrier (latency);
- *many per run*: one `strategy.run` whose function calls `all_reduce` `k` times, against `k`
  raw calls back to back (the cost of a collective inside a training step).

Reported: nbdist / raw time per size (latency ratio; target <= 1.15 at 4 KiB) and raw / nbdist
(throughput ratio; target >= 0.9 from 1 MiB up), each as ratio of medians (primary) and median
of paired ratios (cross-check), per launch of a fresh pair of workers; the figure is the median
over `LAUNCHES` launches (one with `--quick`).

Run: `python benchmarks/bench_user_collective.py [--quick]`.
"""

from __future__ import annotations

import sys
from typing import Any

from _common import check, finish, fmt_time, median, paired_ratios, table
from bench_multi_worker_common import (
    launch,
    lockstep,
    machine_line,
    parse_multi_worker_args,
    rank_summaries,
    worker_setup,
)

NAME = "user_collective"
KIB = 1024
MIB = 1024 * KIB
SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB, 16 * MIB]
# size: (trials call by call, collectives per run, trials many per run)
PLAN = {
    4 * KIB: (400, 64, 40), 64 * KIB: (300, 32, 40), 1 * MIB: (200, 8, 30),
    4 * MIB: (80, 4, 20), 16 * MIB: (30, 2, 12),
}  # fmt: skip
# Fresh pairs of worker processes per run: on a small machine a ratio moves more from launch to
# launch (where threads land, memory layout) than within one launch, so the reported ratio is
# the median over launches of each launch's ratio of medians.
LAUNCHES = 3
LATENCY_TARGET = 1.15
THROUGHPUT_TARGET = 0.9


def _label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: time nbdist and raw at every size, both ways; return the samples."""
    worker_setup()
    import torch
    import torch.distributed as dist

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()  # default settings: telemetry on
    assert strategy.num_replicas_in_sync == 2 and strategy.extended.telemetry.enabled

    def reduce_step(t: torch.Tensor) -> torch.Tensor:
        return nd.get_replica_context().all_reduce("sum", t)

    ones = torch.full((1024,), float(dist.get_rank() + 1))
    assert torch.equal(strategy.run(reduce_step, args=(ones,)), torch.full((1024,), 3.0))

    out: dict[str, Any] = {"single": {}, "bulk": {}}
    for nbytes in params["sizes"]:
        trials, k, bulk_trials = params["plan"][str(nbytes)]
        tensor = torch.zeros(nbytes // 4)

        def many(t: torch.Tensor, k: int = k) -> None:
            ctx = nd.get_replica_context()
            for _ in range(k):
                ctx.all_reduce("sum", t)

        def raw_many(t: torch.Tensor = tensor, k: int = k) -> None:
            for _ in range(k):
                dist.all_reduce(t.clone())

        single = {
            "nbdist": lambda t=tensor: strategy.run(reduce_step, args=(t,)),
            "raw": lambda t=tensor: dist.all_reduce(t.clone()),
        }
        bulk = {
            "nbdist": lambda t=tensor, f=many: strategy.run(f, args=(t,)),
            "raw": raw_many,
        }
        out["single"][str(nbytes)] = lockstep(single, trials=trials, inner=1, barrier=dist.barrier)
        samples = lockstep(bulk, trials=bulk_trials, inner=1, barrier=dist.barrier)
        out["bulk"][str(nbytes)] = {name: [s / k for s in v] for name, v in samples.items()}
    out["telemetry_records"] = len(strategy.extended.telemetry)
    strategy.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=400.0, timeout_help="seconds for the workers"
    )
    plan = {
        str(size): [max(20, t // 8), k, max(6, b // 4)] if args.quick else [t, k, b]
        for size, (t, k, b) in PLAN.items()
    }
    launches = 1 if args.quick else LAUNCHES
    runs = [
        launch("bench_user_collective", {"sizes": SIZES, "plan": plan}, timeout=args.timeout)[0]
        for _ in range(launches)
    ]  # rank 0's samples of each launch
    print(f"== {NAME}: 2 gloo worker processes, default settings (telemetry on, checks on)")
    print(machine_line(env, f", {launches} launch(es)"))
    rows, ratios, stats, checks = [], {}, {}, []
    for nbytes in SIZES:
        key = str(nbytes)
        entry: dict[str, Any] = {}
        row = [_label(nbytes)]
        for how in ("single", "bulk"):
            per_launch = [r[how][key] for r in runs]
            latencies = [median(s["nbdist"]) / median(s["raw"]) for s in per_launch]
            latency = median(latencies)
            paired = median([median(paired_ratios(s["nbdist"], s["raw"])) for s in per_launch])
            nb = [x for s in per_launch for x in s["nbdist"]]
            raw = [x for s in per_launch for x in s["raw"]]
            entry[how] = {"latency_ratio_of_medians": latency, "latency_ratio_paired": paired,
                          "throughput_ratio_of_medians": 1 / latency,
                          "latency_ratio_per_launch": latencies}  # fmt: skip
            row += [fmt_time(median(nb)), fmt_time(median(raw)), f"{latency:.2f}x",
                    f"{1 / latency:.2f}"]  # fmt: skip
            what = "call by call" if how == "single" else "many per run"
            if nbytes == 4 * KIB:
                checks.append(check(f"latency nbdist / raw, 4 KiB, {what}", latency, "<=",
                                    LATENCY_TARGET, cross_check=paired))  # fmt: skip
            if nbytes >= MIB:
                checks.append(check(f"throughput nbdist / raw, {_label(nbytes)}, {what}",
                                    1 / latency, ">=", THROUGHPUT_TARGET,
                                    cross_check=1 / paired))  # fmt: skip
        stats[key] = {
            how: rank_summaries({
                name: [x for r in runs for x in r[how][key][name]] for name in ("nbdist", "raw")
            })
            for how in ("single", "bulk")
        }  # fmt: skip
        rows.append(row)
        ratios[key] = entry
    print(
        table(
            ["size", "1x nbdist", "1x raw", "nb/raw", "raw/nb",
             "bulk nbdist", "bulk raw", "nb/raw", "raw/nb"],
            rows,
        )
    )  # fmt: skip
    print("(1x: one call after a barrier; bulk: per collective, many in one strategy.run;")
    print(" times: medians of every launch's samples; ratios: median over launches)")
    for how, what in (("single", "call by call"), ("bulk", "many per run")):
        spread = ratios[str(4 * KIB)][how]["latency_ratio_per_launch"]
        print(f"4 KiB nb/raw per launch, {what}: " + ", ".join(f"{x:.2f}x" for x in spread))
    return finish(
        NAME,
        checks,
        {
            "description": "strategy.run + ReplicaContext.all_reduce vs dist.all_reduce(t.clone())",
            "environment": env,
            "parameters": {
                "sizes_bytes": SIZES,
                "plan": plan,
                "dtype": "float32",
                "workers": 2,
                "backend": "gloo",
                "telemetry": "on (default)",
            },
            "variants": stats,
            "ratios": ratios,
            "launches": launches,
            "telemetry_records_rank0": [r["telemetry_records"] for r in runs],
        },
    )


if __name__ == "__main__":
    sys.exit(main())
