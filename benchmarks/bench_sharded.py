"""`FullyShardedStrategy` vs hand-written FSDP2 (steps/s) and vs the mirrored strategy (memory).

Speed (2 gloo workers, one CPU thread each): in the same worker processes, the same model
(4 blocks of `Linear(WIDTH, WIDTH)` + tanh, a `Linear(WIDTH, 10)` head), the same wrap policy
(one unit per block's `Linear`, then the root) and the same Adam step on a fixed batch of 32
examples per worker:

- `nbdist`: model and optimizer made in `FullyShardedStrategy(min_shard_bytes=...).scope()`,
  the step in `strategy.run(step, args=(x, y))`;
- `FSDP2` (the anchor): a model wrapped by hand, `fully_shard` on each block's `Linear`, on the
  head, then on the model (the units nbdist's policy chooses), with FSDP2's default
  collectives, stepped outside any strategy.

Both are timed in blocks interleaved on both workers (`lockstep`); target: nbdist >= 0.95x
FSDP2's steps/s. For information, a third model: the hand-wrapped one with nbdist's recorded
collectives (`nbdist.collectives.sharded`) in place of FSDP2's defaults, which separates what
the collectives cost from what `strategy.run` costs.

Memory (2 and 4 workers, one launch per strategy and worker count so that each process's peak
is its own): a larger model of the same shape (8 blocks, `MEM_WIDTH`), 3 Adam steps, then per
worker: the bytes of its parameters, gradients and Adam state measured from the tensors (local
shards for the sharded strategy), and its peak resident memory above the baseline taken after
a warm-up step of a tiny model (its imports and buffers) and before the model is built
(`ru_maxrss`). Targets: the tensor bytes
per worker are 1/N of the mirrored strategy's (within 1 %). The peak resident memory is
reported, not checked: a sharded model is built whole before the scope shards it (docs/
sharding.md), so that peak holds one whole copy of the parameters (not of gradients and state).
The memory launches run with glibc's mmap threshold fixed (`MALLOC_ENV`).

Run: `python benchmarks/bench_sharded.py [--quick]`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import check, environment, finish, median, paired_ratios, summarize, table

HERE = Path(__file__).resolve().parent
WIDTH, MEM_WIDTH, BATCH = 256, 1024, 32


MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
"""The memory launches fix glibc's mmap threshold (128 KiB): by default it rises to 32 MiB
once large blocks are freed, and FSDP2's gather buffers, freed after each unit, then stay in
the heap, so the RSS would count every buffer ever used instead of those alive together. Both
strategies run with it."""


def _launch(
    params: dict[str, Any], workers: int, timeout: float, env: dict[str, str] | None = None
) -> list[Any]:
    from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

    code = f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        import bench_sharded as bench
        report(bench.worker(json.loads({json.dumps(params)!r})))
    """
    port = free_port()
    envs = [{**torchrun_env(rank, workers, port), "CUDA_VISIBLE_DEVICES": "", **(env or {})}
            for rank in range(workers)]  # fmt: skip
    results = run_workers(code, envs, timeout=timeout, cwd=HERE, fail_fast=True)
    assert_all_ok(results)
    return [r.result for r in results]


def _model(width: int, blocks: int) -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

    return torch.nn.Sequential(*[Block() for _ in range(blocks)], torch.nn.Linear(width, 10))


def _held(model: Any, optimizer: Any) -> int:
    import torch

    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    total = sum(nbytes(p) for p in params) + sum(nbytes(p.grad) for p in params
                                                 if p.grad is not None)  # fmt: skip
    for p in params:
        total += sum(nbytes(v) for v in optimizer.state[p].values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0)  # fmt: skip
    return total


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One worker of a launch: `params["phase"]` is "speed" or "memory"."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    import nbdist as nd

    if params["phase"] == "memory":
        if params["strategy"] == "sharded":
            strategy = nd.experimental.FullyShardedStrategy(min_shard_bytes=1 << 16)
        else:
            strategy = nd.MultiWorkerMirroredStrategy()
        with strategy.scope():  # a warm-up: the imports and buffers of a first step, not measured
            tiny = _model(16, 2)
            tiny_optimizer = torch.optim.Adam(tiny.parameters(), lr=1e-4)

        def tiny_step() -> None:
            tiny_optimizer.zero_grad()
            F.cross_entropy(tiny(torch.randn(4, 16)), torch.randint(0, 10, (4,))).backward()
            tiny_optimizer.step()

        strategy.run(tiny_step)
        del tiny, tiny_optimizer
        strategy.process_group.barrier()
        baseline = _peak_rss()
        with strategy.scope():
            model = _model(MEM_WIDTH, 8)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        x, y = torch.randn(BATCH, MEM_WIDTH), torch.randint(0, 10, (BATCH,))

        def step() -> None:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        for _ in range(3):
            strategy.run(step)
        out = {"held": _held(model, optimizer), "peak_rss_above_baseline": _peak_rss() - baseline}
        strategy.shutdown()
        return out

    from torch.distributed.fsdp import fully_shard

    strategy = nd.experimental.FullyShardedStrategy(min_shard_bytes=1024)
    torch.manual_seed(0)
    with strategy.scope():
        model = _model(WIDTH, 4)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    from torch.distributed.device_mesh import init_device_mesh

    from nbdist.collectives.sharded import FsdpAllGather, FsdpReduceScatter

    mesh = init_device_mesh("cpu", (strategy.num_replicas_in_sync,))

    def wrapped(recorded: bool) -> tuple[Any, Any]:
        torch.manual_seed(0)
        anchor = _model(WIDTH, 4)
        for unit in [block.lin for block in list(anchor)[:4]] + [anchor[4], anchor]:
            fully_shard(unit, mesh=mesh, reshard_after_forward=True)
            if recorded:
                unit.set_custom_all_gather(FsdpAllGather(strategy.process_group))
                unit.set_custom_reduce_scatter(FsdpReduceScatter(strategy.process_group))
        return anchor, torch.optim.Adam(anchor.parameters(), lr=1e-4)

    anchor, anchor_optimizer = wrapped(False)
    recorded, recorded_optimizer = wrapped(True)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))

    def nbdist_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    def fsdp2_step() -> None:
        anchor_optimizer.zero_grad()
        F.cross_entropy(anchor(x), y).backward()
        anchor_optimizer.step()

    def recorded_step() -> None:
        recorded_optimizer.zero_grad()
        F.cross_entropy(recorded(x), y).backward()
        recorded_optimizer.step()

    sys.path.insert(0, str(HERE))
    from bench_multi_worker_common import lockstep

    barrier = strategy.process_group.barrier
    samples = lockstep(
        {"nbdist": lambda: strategy.run(nbdist_step), "FSDP2": fsdp2_step,
         "FSDP2, nbdist's collectives": recorded_step},
        trials=params["trials"], inner=params["inner"], barrier=barrier,
    )  # fmt: skip
    strategy.shutdown()
    return samples


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few trials (smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="ignored: workers use 1 thread")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    args = parser.parse_args(argv)
    env = environment()
    trials, inner = (4, 5) if args.quick else (15, 20)
    print(__doc__.splitlines()[0])
    print(f"cpu_count {env['cpu_count']}, load {env['loadavg_at_start']}; times are rank 0's")

    start = time.perf_counter()
    speed = _launch({"phase": "speed", "trials": trials, "inner": inner}, 2, args.timeout)
    rank0 = speed[0]
    stats = {name: summarize(s) for name, s in rank0.items()}
    ratios = paired_ratios(rank0["FSDP2"], rank0["nbdist"])  # nbdist steps/s over FSDP2's
    ratio = median(ratios)
    rows = [[name, f"{1e3 * s['median_s']:.2f}", f"{1 / s['median_s']:.1f}"]
            for name, s in stats.items()]  # fmt: skip
    print(table(["variant", "ms/step (median)", "steps/s"], rows))
    print(f"nbdist / FSDP2 steps/s: {ratio:.3f}x")

    memory: dict[str, dict[str, Any]] = {}
    rows = []
    for workers in (2, 4):
        for name in ("mirrored", "sharded"):
            outs = _launch({"phase": "memory", "strategy": name}, workers, args.timeout,
                           MALLOC_ENV)  # fmt: skip
            held = max(o["held"] for o in outs)
            peak = max(o["peak_rss_above_baseline"] for o in outs)
            memory[f"{name}@{workers}"] = {"held_bytes": held, "peak_rss_above_baseline": peak}
            rows.append([name, workers, f"{held / 2**20:.1f} MiB", f"{peak / 2**20:.1f} MiB"])
    print(table(["strategy", "workers", "params+grads+Adam per worker", "peak RSS above "
                 "baseline"], rows))  # fmt: skip
    checks = [
        check("nbdist steps/s over hand-written FSDP2 (2 workers)", ratio, ">=", 0.95,
              cross_check=stats["FSDP2"]["median_s"] / stats["nbdist"]["median_s"]),
    ]
    for workers in (2, 4):
        share = memory[f"sharded@{workers}"]["held_bytes"] / memory[f"mirrored@{workers}"][
            "held_bytes"
        ]
        checks.append(check(f"sharded / mirrored tensor bytes per worker at {workers} workers",
                            share * workers, "<=", 1.01, unit="x N"))  # fmt: skip
    payload = {
        "environment": env, "speed": {"rank0": stats, "ratio_median": ratio,
                                      "trials": trials, "inner": inner},
        "memory": memory, "seconds": time.perf_counter() - start,
    }  # fmt: skip
    return finish("bench_sharded", checks, payload)


if __name__ == "__main__":
    sys.exit(main())
