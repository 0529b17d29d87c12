"""Training steps/s of `MultiWorkerMirroredStrategy` vs hand-written PyTorch DDP, 2 gloo workers.

Setup: 2 worker processes (torchrun variables, one CPU replica and one torch thread each). The
strategy is created first and creates the default process group; a DDP model
(`torch.nn.parallel.DistributedDataParallel`, default buckets) of the same architecture and
initial weights uses that same group. Both train, in blocks interleaved on both workers, with
the same fixed batch of 64 examples per replica (128 per step), cross-entropy, SGD with
momentum 0.9:

- `nbdist`: model and optimizer made in `strategy.scope()`, the step (`zero_grad`, forward,
  `backward`, `optimizer.step()`) in `strategy.run(step, args=(x, y))`; nbdist averages the
  gradients in buckets during backward.
- `DDP` (the anchor): the same step, outside any strategy.

Models: (i) `mlp`: MLP 784-512-512-10 (6 parameter tensors, 2.7 MB of gradients); (ii)
`small100`: 50 `Linear(16, 16)` in a row (100 small parameter tensors, 54 KB), where per-tensor
overheads dominate. Targets: nbdist >= 1.0x DDP's steps/s on both (issue 13: DDP is the floor a
user can always fall back to).

Compression: a second pair of workers (nbdist refuses a second strategy in one process) makes the
strategy with `CommunicationOptions(compression="bf16")` and compares it, again interleaved,
with plain fp32 DDP (target: >= 1.3x DDP's steps/s on the MLP) and, for information, with DDP
plus a bf16 communication hook
(PyTorch's `bf16_compress_hook` written out: PyTorch's own refuses CPU tensors).

Both sides take the same steps from the same weights, so after timing, the uncompressed nbdist
and DDP models are compared (world size 2: both averages are exact, they should be identical).
For information, each launch also times the same step on a third, local model with no
communication at all: its steps/s over DDP's is the most any gradient sync (compressed or not)
could gain over DDP on this machine.

Replica check (Note [Replica check]): each launch also times
`strategy.check_replicas_identical()` on the trained nbdist model, in lockstep blocks as the
steps; its cost per training step is one check over `REPLICA_CHECK_EVERY` steps divided by
nbdist's time per step (target: < 1 %). The step times above already include the checks that
fell due and the per-step count that schedules them.

Run: `python benchmarks/bench_multi_worker_training.py [--quick]`.
"""

from __future__ import annotations

import sys
from typing import Any

from _common import (
    check,
    finish,
    fmt_iqr,
    fmt_time,
    median,
    paired_ratios,
    summarize,
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

NAME = "multi_worker_training"
BATCH_PER_REPLICA = 64
MODELS = ("mlp", "small100")
# (steps per timed block, trials) per model.
PLAN = {"mlp": (5, 20), "small100": (10, 20)}
# Fresh pairs of workers per run; ratios are the median over launches of each launch's ratio
# (on a small machine they move more from launch to launch than within one).
LAUNCHES = 3
TARGET = 1.0
BF16_TARGET = 1.3
CHECK_TARGET_PCT = 1.0  # the replica check's share of a step, in %


def _build(name: str) -> Any:
    import torch

    if name == "mlp":
        return torch.nn.Sequential(
            torch.nn.Linear(784, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 10),
        )
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(50)])


def _batch(name: str, rank: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    features, classes = (784, 10) if name == "mlp" else (16, 16)
    x = torch.randn(BATCH_PER_REPLICA, features, generator=generator)
    y = torch.randint(0, classes, (BATCH_PER_REPLICA,), generator=generator)
    return x, y


def _bf16_hook(state, bucket):  # unannotated: DDP checks the annotations it finds
    """PyTorch's `bf16_compress_hook`, which refuses CPU tensors (it wants NCCL or XCCL)."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(done: Any) -> Any:
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(decompress)


def _sgd(parameters: Any) -> Any:
    import torch

    return torch.optim.SGD(parameters, lr=0.01, momentum=0.9)


def _plain_step(module: Any, optimizer: Any, x: Any, y: Any) -> None:
    import torch

    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()


def _time_model(strategy: Any, name: str, compression: str | None, inner: int, trials: int):
    """Interleave nbdist, DDP (, DDP + bf16 hook) and a local step for one model."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    x, y = _batch(name, dist.get_rank())
    torch.manual_seed(0)
    with strategy.scope():
        model = _build(name)
        optimizer = _sgd(model.parameters())
    torch.manual_seed(0)
    ddp = DistributedDataParallel(_build(name))
    ddp_optimizer = _sgd(ddp.parameters())
    variants = {
        "nbdist" if compression is None else f"nbdist {compression}": (
            lambda: strategy.run(_plain_step, args=(model, optimizer, x, y))
        ),
        "DDP": lambda: _plain_step(ddp, ddp_optimizer, x, y),
    }
    if compression == "bf16":
        torch.manual_seed(0)
        hooked = DistributedDataParallel(_build(name))
        hooked.register_comm_hook(None, _bf16_hook)
        hooked_optimizer = _sgd(hooked.parameters())
        variants["DDP + bf16 hook"] = lambda: _plain_step(hooked, hooked_optimizer, x, y)
    torch.manual_seed(0)
    local = _build(name)  # the same step with no communication: the ceiling for any sync
    local_optimizer = _sgd(local.parameters())
    variants["local (no communication)"] = lambda: _plain_step(local, local_optimizer, x, y)
    samples = lockstep(variants, trials=trials, inner=inner, barrier=dist.barrier)
    samples["replica check"] = lockstep(
        {"check": strategy.check_replicas_identical}, trials=trials, inner=inner,
        barrier=dist.barrier,
    )["check"]  # fmt: skip
    # Same steps from the same weights: how far apart did nbdist and DDP end up?
    with torch.no_grad():
        diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ddp.parameters()))
    return samples, diff


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: nbdist vs DDP (and DDP + bf16 hook when compressing) for each model."""
    worker_setup()
    import torch.distributed as dist

    import nbdist as nd

    compression = params["compression"]
    strategy = nd.MultiWorkerMirroredStrategy(
        communication_options=nd.experimental.CommunicationOptions(compression=compression)
    )
    assert strategy.num_replicas_in_sync == 2 and dist.is_initialized()
    out: dict[str, Any] = {"samples": {}, "max_abs_diff": {}}
    for name in params["models"]:
        inner, trials = params["plan"][name]
        out["samples"][name], out["max_abs_diff"][name] = _time_model(
            strategy, name, compression, inner, trials
        )
    strategy.shutdown()
    return out


def _rows(name: str, samples: dict[str, list[float]]) -> list[list[str]]:
    return [
        [name, variant, fmt_time(median(s)), f"{1 / median(s):.1f}",
         fmt_iqr(summarize(s))]
        for variant, s in samples.items()
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=150.0, timeout_help="seconds per launch"
    )
    plan = {m: [inner, 4 if args.quick else trials] for m, (inner, trials) in PLAN.items()}
    launches = 1 if args.quick else LAUNCHES
    plain_runs, bf16_runs = [], []
    for _ in range(launches):  # each: [rank 0's result, rank 1's result]
        plain_runs.append(launch(
            "bench_multi_worker_training",
            {"compression": None, "models": list(MODELS), "plan": plan},
            timeout=args.timeout,
        ))  # fmt: skip
        bf16_runs.append(launch(
            "bench_multi_worker_training",
            {"compression": "bf16", "models": ["mlp"], "plan": plan},
            timeout=args.timeout,
        ))  # fmt: skip

    print(f"== {NAME}: 2 gloo workers x 1 CPU replica, batch {BATCH_PER_REPLICA} per replica")
    print(machine_line(env, f", {launches} launch(es)"))
    rows: list[list[str]] = []
    ratios: dict[str, dict[str, Any]] = {}
    stats: dict[str, Any] = {}
    checks = []
    from nbdist.strategies.multi_worker import REPLICA_CHECK_EVERY

    check_rows: list[list[str]] = []
    check_costs: dict[str, dict[str, float]] = {}
    for model in MODELS:
        per_launch = [run[0]["samples"][model] for run in plain_runs]
        one = median([median(s.pop("replica check")) for s in per_launch])
        for run in plain_runs + bf16_runs:
            for rank in run:
                rank["samples"].get(model, {}).pop("replica check", None)
        step = median([median(s["nbdist"]) for s in per_launch])
        pct = 100 * one / REPLICA_CHECK_EVERY / step
        check_costs[model] = {"check_s": one, "step_s": step, "percent_of_step": pct}
        check_rows.append([model, fmt_time(one), fmt_time(step), f"{pct:.3f} %"])
        checks.append(check(f"replica check share of a step (every {REPLICA_CHECK_EVERY}), "
                            f"{model}", pct, "<", CHECK_TARGET_PCT, unit="%"))  # fmt: skip
    for label, runs, nb_name in (("", plain_runs, "nbdist"), (" bf16", bf16_runs, "nbdist bf16")):
        for model in runs[0][0]["samples"]:
            per_launch = [run[0]["samples"][model] for run in runs]
            rank1s = [run[1]["samples"][model] for run in runs]
            samples = {v: [x for s in per_launch for x in s[v]] for v in per_launch[0]}
            rank1 = {v: [x for s in rank1s for x in s[v]] for v in rank1s[0]}
            rows += _rows(model + label, samples)

            def over(runs_: list, variant: str, base: str = "DDP") -> float:
                return median([median(s[base]) / median(s[variant]) for s in runs_])

            of_launches = [median(s["DDP"]) / median(s[nb_name]) for s in per_launch]
            of_medians = median(of_launches)
            paired = median([median(paired_ratios(s["DDP"], s[nb_name])) for s in per_launch])
            key = f"{model}{label.replace(' ', '_')}"
            ratios[key] = {
                "steps_per_s_ratio_of_medians": of_medians,
                "steps_per_s_ratio_per_launch": of_launches,
                "steps_per_s_ratio_paired": paired,
                "steps_per_s_ratio_rank1_of_medians": over(rank1s, nb_name),
            }
            stats[key] = {
                "rank0": rank_summaries(samples),
                "rank1": rank_summaries(rank1),
            }
            ratios[key]["local_over_ddp_of_medians"] = over(per_launch, "local (no communication)")
            if "DDP + bf16 hook" in samples:
                ratios[key]["ddp_bf16_hook_over_ddp_of_medians"] = over(
                    per_launch, "DDP + bf16 hook"
                )
            target = BF16_TARGET if label else TARGET
            checks.append(
                check(f"{nb_name} / DDP steps/s, {model}", of_medians, ">=", target,
                      cross_check=paired)
            )  # fmt: skip
    print(table(["model", "variant", "time/step", "steps/s", "IQR"], rows))
    print()
    print(
        table(
            ["ratio (steps/s over DDP's)", "ratio of medians", "paired", "rank 1"],
            [[k, f"{r['steps_per_s_ratio_of_medians']:.3f}x",
              f"{r['steps_per_s_ratio_paired']:.3f}x",
              f"{r['steps_per_s_ratio_rank1_of_medians']:.3f}x"] for k, r in ratios.items()]
            + [[f"DDP + bf16 hook ({k})", f"{r['ddp_bf16_hook_over_ddp_of_medians']:.3f}x", "", ""]
               for k, r in ratios.items() if "ddp_bf16_hook_over_ddp_of_medians" in r]
            + [[f"ceiling: local, no communication ({k})",
                f"{r['local_over_ddp_of_medians']:.3f}x", "", ""] for k, r in ratios.items()],
        )
    )  # fmt: skip
    print("per launch (ratio of medians): " + "; ".join(
        f"{k} " + ", ".join(f"{x:.3f}x" for x in r["steps_per_s_ratio_per_launch"])
        for k, r in ratios.items()))  # fmt: skip
    print(f"\nreplica check (every {REPLICA_CHECK_EVERY} optimizer steps):")
    print(table(["model", "one check", "nbdist step", "share of a step"], check_rows))
    diffs = {m: max(run[0]["max_abs_diff"][m] for run in plain_runs) for m in MODELS}
    print(
        "\nmax |nbdist - DDP| over parameters after the same steps (fp32): "
        + ", ".join(f"{m} {d:.3g}" for m, d in diffs.items())
        + "\n"
    )
    return finish(
        NAME,
        checks,
        {
            "description": "2-worker training steps/s: nbdist MWMS (strategy.run) vs PyTorch DDP",
            "environment": env,
            "parameters": {"models": list(MODELS), "plan": plan, "batch_per_replica":
                           BATCH_PER_REPLICA, "workers": 2, "backend": "gloo",
                           "threads_per_worker": 1, "optimizer": "SGD(lr=0.01, momentum=0.9)"},
            "variants": stats,
            "ratios": ratios,
            "max_abs_diff_fp32": diffs,
            "max_abs_diff_bf16_vs_fp32_ddp": bf16_runs[0][0]["max_abs_diff"],
            "replica_check": {"every": REPLICA_CHECK_EVERY, **check_costs},
            "launches": launches,
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
