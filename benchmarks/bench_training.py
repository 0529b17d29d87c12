"""Engine training at DDP speed: nbdist on engines vs torchrun DDP, and vs DDP in-process.

Part A, end to end (issue 30 item 3's first target, >= 0.95x): per round, in alternating
order, (a) `nbdist demo`'s training on 2 engines (`run_demo`: the CNN of
`nbdist.app.training`, its `MultiWorkerMirroredStrategy`, `strategy.run_steps` one round trip
per epoch, evaluation after every epoch) and (b) the same model, data, global batch (64),
optimizer, epochs and per-epoch evaluation written by hand with `DistributedDataParallel`, 2
gloo ranks under `torchrun` on the same cores (`bench_demo.DDP_SCRIPT`). Training steps/s =
steps / training seconds, both from the first step to the last epoch's evaluation.

Part B, the same processes (the second target, >= 1.0x): 2 torchrun-style gloo workers
(`bench_multi_worker_common.launch`); in each, in lock step and interleaved block by block:

- `nbdist demo step`: `strategy.run(training.train_and_report, args=(next(it),))` over the
  demo's own distributed iterator: what an engine runs per step of `run_steps`;
- `DDP demo step`: the torchrun script's step (index the rank's rows, DDP forward/backward,
  Adam, the loss totals' `dist.all_reduce`; the test-set evaluation at each epoch's end, as
  the demo's iterator does);
- the gradient path alone, one fixed batch, plain `zero_grad; backward; step`: nbdist's
  buckets (model made in scope, inside `strategy.run`), DDP's C++ reducer, DDP's reducer with
  a Python comm hook that keeps nbdist's telemetry record (what building the mirrored path on
  DDP would cost at least), and no communication at all.

Each variant reports wall time per step (the targets use it) and the main thread's CPU time
per step (`time.thread_time`: what the step's own code costs, less sensitive to the other
processes on a loaded machine). Load averages are printed before and after; on a machine
shared with other work, read the ratios, not the absolute times.

    python benchmarks/bench_training.py [--rounds 4] [--epochs 6] [--quick]

Prints tables and writes benchmarks/results/training.json.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import benchmark_parser, check, environment, finish, median, paired_ratios, table

NAME = "training"
HERE = Path(__file__).resolve().parent
TARGET_TORCHRUN = 0.95
TARGET_IN_PROCESS = 1.0
# Part B: (steps per timed block, trials); one block is one demo epoch's 23 steps.
INNER, TRIALS = 23, 12


# -- part B: one rank ------------------------------------------------------------------------
def _ddp_demo_step(model: Any, optimizer: Any, data: Any, rank: int, size: int) -> Any:
    """The torchrun script's step as a closure: its own batches, evaluation at an epoch's end."""
    import torch
    import torch.distributed as dist

    from nbdist.app.training import GLOBAL_BATCH_SIZE

    def batches() -> Any:
        epoch = 0
        while True:
            epoch += 1
            order = torch.randperm(
                len(data.x_train), generator=torch.Generator().manual_seed(epoch)
            )
            chunks = order.split(GLOBAL_BATCH_SIZE)
            for index, idx in enumerate(chunks):
                mine = idx[rank::size]
                yield data.x_train[mine], data.y_train[mine], index == len(chunks) - 1

    stream = batches()

    def step() -> None:
        x, y, last = next(stream)
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = losses.sum() * size / GLOBAL_BATCH_SIZE
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        totals = torch.stack([losses.detach().sum(), torch.tensor(float(len(y)))])
        dist.all_reduce(totals)
        if last:
            with torch.no_grad():
                tx, ty = data.x_test[rank::size], data.y_test[rank::size]
                score = torch.stack(
                    [(model(tx).argmax(1) == ty).sum().float(), torch.tensor(float(len(ty)))]
                )
            dist.all_reduce(score)

    return step


def _telemetry_hook(group: Any, world_size: int) -> Any:
    """A DDP comm hook that all-reduces a bucket on nbdist's group and records it in nbdist's
    telemetry, as a mirrored gradient path built on DDP's reducer would at least."""
    import torch

    from nbdist.collectives.direct import start_all_reduce
    from nbdist.core.reduce.op import ReduceOp

    def hook(state, bucket):  # unannotated: DDP checks the annotations it finds
        buffer = bucket.buffer()
        start = time.perf_counter()
        work = start_all_reduce(buffer, ReduceOp.SUM, async_op=True, world=None)

        def done(_: Any) -> torch.Tensor:
            group.record("gradient_sync", buffer.numel() * buffer.element_size(), start)
            return buffer.mul_(1.0 / world_size)

        return work.get_future().then(done)

    return hook


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank of part B: every variant, interleaved in lock step; wall and thread CPU."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import nbdist as nd
    from nbdist.app import training
    from nbdist.app.training import GLOBAL_BATCH_SIZE, LEARNING_RATE, build_model

    torch.set_num_threads(1)
    strategy = nd.MultiWorkerMirroredStrategy()
    rank, size = dist.get_rank(), dist.get_world_size()
    training.setup(strategy, seed=0)  # the demo's model and optimizer, made in scope
    data = training._job["data"]
    demo_batches = training.epochs_with_reports(10**6)

    def adam(module: Any) -> Any:
        return torch.optim.Adam(module.parameters(), lr=LEARNING_RATE)

    torch.manual_seed(0)
    ddp = DistributedDataParallel(build_model())
    ddp_demo = _ddp_demo_step(ddp, adam(ddp), data, rank, size)
    with strategy.scope():
        torch.manual_seed(0)
        mirrored = build_model()
        mirrored_opt = adam(mirrored)
    torch.manual_seed(0)
    plain_ddp = DistributedDataParallel(build_model())
    plain_ddp_opt = adam(plain_ddp)
    torch.manual_seed(0)
    hooked = DistributedDataParallel(build_model())
    hooked.register_comm_hook(None, _telemetry_hook(strategy.process_group, size))
    hooked_opt = adam(hooked)
    torch.manual_seed(0)
    local = build_model()
    local_opt = adam(local)
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(1))
    mine = order[:GLOBAL_BATCH_SIZE][rank::size]
    x, y = data.x_train[mine], data.y_train[mine]

    def plain(module: Any, optimizer: Any) -> None:
        losses = torch.nn.functional.cross_entropy(module(x), y, reduction="none")
        optimizer.zero_grad()
        (losses.sum() * size / GLOBAL_BATCH_SIZE).backward()
        optimizer.step()

    variants = {
        "nbdist demo step": lambda: strategy.run(
            training.train_and_report, args=(next(demo_batches),)
        ),
        "DDP demo step": ddp_demo,
        "grad: nbdist buckets": lambda: strategy.run(plain, args=(mirrored, mirrored_opt)),
        "grad: DDP": lambda: plain(plain_ddp, plain_ddp_opt),
        "grad: DDP + telemetry hook": lambda: plain(hooked, hooked_opt),
        "grad: no communication": lambda: plain(local, local_opt),
    }
    inner, trials = params["inner"], params["trials"]
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(inner):  # warm up: one demo epoch each
            fn()
    for trial in range(trials):
        names = list(variants) if trial % 2 == 0 else list(variants)[::-1]
        for name in names:
            fn = variants[name]
            dist.barrier()
            gc.disable()
            try:
                start, thread = time.perf_counter(), time.thread_time()
                for _ in range(inner):
                    fn()
                wall[name].append((time.perf_counter() - start) / inner)
                cpu[name].append((time.thread_time() - thread) / inner)
            finally:
                gc.enable()
    # nbdist's buckets and DDP took the same steps from the same weights on the same batch.
    with torch.no_grad():
        diff = max(
            float((a - b).abs().max())
            for a, b in zip(mirrored.parameters(), plain_ddp.module.parameters())
        )
    kinds = sorted({r.op for r in strategy.extended.telemetry.records() if hasattr(r, "op")})
    strategy.shutdown()
    return {"wall": wall, "cpu": cpu, "max_abs_diff": diff, "telemetry_ops": kinds}


# -- part A: engines vs torchrun --------------------------------------------------------------
def _end_to_end(rounds: int, epochs: int) -> dict[str, Any]:
    from bench_demo import run_ddp, run_nbdist

    engines: list[dict[str, Any]] = []
    torchrun: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ("nbdist", "ddp") if r % 2 == 0 else ("ddp", "nbdist")
            for side in order:
                if side == "nbdist":
                    engines.append(run_nbdist(epochs, Path(tmp)))
                else:
                    torchrun.append(run_ddp(epochs, Path(tmp)))
    nb_sps = [m["steps"] / m["timings"]["training"] for m in engines]
    ddp_sps = [d["steps"] / d["seconds"] for d in torchrun]
    return {
        "engines_steps_per_s": nb_sps,
        "torchrun_ddp_steps_per_s": ddp_sps,
        "engines_first_step_s": [m["timings"]["first_step"] for m in engines],
        "engines_accuracy": [m["accuracy"] for m in engines],
        "torchrun_accuracy": [d["accuracy"] for d in torchrun],
        "ratio_of_medians": median(nb_sps) / median(ddp_sps),
        "median_paired_ratio": median(paired_ratios(nb_sps, ddp_sps)),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=4, help="part A rounds (each side once)")
    parser.add_argument("--epochs", type=int, default=6, help="part A epochs per run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 3 trials")
    parser.add_argument("--threads", type=int, default=1, help="ignored: 1 thread per rank")
    parser.add_argument("--skip-engines", action="store_true", help="part B only")
    args = parser.parse_args(argv)
    env = environment()
    rounds, trials = (1, 3) if args.quick else (args.rounds, TRIALS)
    load_before = _load()
    from bench_multi_worker_common import launch

    # Part B first, then A, then B again: each part sees the load the other saw.
    same = [launch("bench_training", {"inner": INNER, "trials": trials}, timeout=600)]
    end = None if args.skip_engines else _end_to_end(rounds, args.epochs)
    if not args.quick:
        same.append(launch("bench_training", {"inner": INNER, "trials": trials}, timeout=600))
    load_after = _load()

    print(f"== {NAME}: the demo's CNN, 2 gloo ranks x 1 CPU thread, global batch 64")
    print(f"cpu_count {env['cpu_count']}, load {load_before} before, {load_after} after "
          "(1, 5, 15 min); on a shared machine read the ratios")  # fmt: skip
    checks = []
    result: dict[str, Any] = {"environment": env, "load_before": load_before,
                              "load_after": load_after}  # fmt: skip
    if end is not None:
        print(f"\nA. training steps/s, {args.epochs} epochs x 23 steps, {rounds} round(s), "
              "alternating")  # fmt: skip
        print(table(
            ["side", "steps/s (median)", "per round"],
            [["nbdist demo on 2 engines", f"{median(end['engines_steps_per_s']):.1f}",
              ", ".join(f"{v:.1f}" for v in end["engines_steps_per_s"])],
             ["DDP under torchrun", f"{median(end['torchrun_ddp_steps_per_s']):.1f}",
              ", ".join(f"{v:.1f}" for v in end["torchrun_ddp_steps_per_s"])]],
        ))  # fmt: skip
        print(f"engines / torchrun: {end['ratio_of_medians']:.3f}x (median of paired rounds "
              f"{end['median_paired_ratio']:.3f}x); engines' first step "
              f"{median(end['engines_first_step_s']) * 1e3:.0f} ms")  # fmt: skip
        checks.append(check("nbdist on engines / torchrun DDP, steps/s",
                            end["ratio_of_medians"], ">=", TARGET_TORCHRUN,
                            cross_check=end["median_paired_ratio"]))  # fmt: skip
        result["end_to_end"] = end
    rank0 = [run[0] for run in same]
    names = list(rank0[0]["wall"])
    wall = {n: [x for run in rank0 for x in run["wall"][n]] for n in names}
    cpu = {n: [x for run in rank0 for x in run["cpu"][n]] for n in names}
    base_wall, base_cpu = median(wall["DDP demo step"]), median(cpu["DDP demo step"])
    grad_wall = median(wall["grad: DDP"])
    rows = []
    for n in names:
        anchor = grad_wall if n.startswith("grad") else base_wall
        rows.append([n, f"{median(wall[n]) * 1e3:.3f}", f"{median(cpu[n]) * 1e3:.3f}",
                     f"{anchor / median(wall[n]):.3f}x"])  # fmt: skip
    print(f"\nB. the same processes, {INNER} steps per block, {trials} blocks per launch, "
          f"{len(same)} launch(es); rank 0's medians")  # fmt: skip
    print(table(["variant", "wall ms/step", "main-thread CPU ms/step",
                 "steps/s over DDP's (demo step / grad: DDP)"], rows))  # fmt: skip
    per_launch = [median(r["wall"]["DDP demo step"]) / median(r["wall"]["nbdist demo step"])
                  for r in rank0]  # fmt: skip
    paired = median(paired_ratios(wall["DDP demo step"], wall["nbdist demo step"]))
    in_process = base_wall / median(wall["nbdist demo step"])
    print(f"nbdist demo step / DDP demo step: {in_process:.3f}x steps/s (paired blocks "
          f"{paired:.3f}x; per launch {', '.join(f'{v:.3f}x' for v in per_launch)}); main-"
          f"thread CPU {median(cpu['nbdist demo step']) / base_cpu:.3f}x DDP's")  # fmt: skip
    diffs = [r["max_abs_diff"] for r in rank0]
    print(f"max |nbdist buckets - DDP| over parameters after the same steps: {max(diffs):.3g}; "
          f"telemetry ops recorded: {rank0[0]['telemetry_ops']}\n")  # fmt: skip
    checks.append(check("nbdist demo step / DDP demo step (same processes), steps/s",
                        in_process, ">=", TARGET_IN_PROCESS, cross_check=paired))  # fmt: skip
    result["same_processes"] = {
        "inner": INNER, "trials": trials, "launches": len(same),
        "wall_s": wall, "main_thread_cpu_s": cpu,
        "ratio_of_medians": in_process, "median_paired_ratio": paired,
        "per_launch": per_launch, "max_abs_diff": diffs,
        "telemetry_ops": rank0[0]["telemetry_ops"],
    }  # fmt: skip
    return finish(NAME, checks, result)


if __name__ == "__main__":
    sys.exit(main())
