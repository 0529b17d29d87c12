"""Shared by the multi-worker benchmarks (not a benchmark itself): launch two gloo workers, time
variants in lock step on both, hand the samples back to the parent.

The parent process (`launch`) starts two fresh Python processes with `nbdist.testing.run_workers`
and torchrun's variables (`torchrun_env`, one port from `free_port`); each imports the
benchmark module by name from `benchmarks/` and runs its `worker(params)` function, whose
return value comes back through `report`. Inside the workers, `lockstep` times every variant in
blocks, interleaved (the order reversed every other trial), with a raw `torch.distributed`
barrier (untimed) before each block so both ranks start a block together and run the same
collectives in the same order. Rank 0's samples are the primary statistic; rank 1's are kept
in the JSON (after the first collective of a block the ranks move in step, so they agree).

Each worker uses one intra-op torch thread (`OMP_NUM_THREADS=1`, as `run_workers` and
torchrun set it): two workers on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import benchmark_parser, environment, round_robin, summarize

HERE = Path(__file__).resolve().parent


def launch(module: str, params: dict[str, Any], *, timeout: float) -> list[Any]:
    """Run `module.worker(params)` in 2 torchrun-style workers; return each rank's result.

    The workers see no GPU (`CUDA_VISIBLE_DEVICES=""`): these benchmarks measure 2 gloo
    workers on the CPU, on a GPU machine too (two workers on one GPU would pick NCCL, which
    refuses to share a GPU).
    """
    from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

    code = f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        import {module} as bench
        report(bench.worker(json.loads({json.dumps(params)!r})))
    """
    port = free_port()
    results = run_workers(
        code, [{**torchrun_env(rank, 2, port), "CUDA_VISIBLE_DEVICES": ""} for rank in range(2)],
        timeout=timeout, cwd=HERE, fail_fast=True,
    )  # fmt: skip
    assert_all_ok(results)
    missing = [r.rank for r in results if not r.reported]
    if missing:
        raise RuntimeError(f"worker(s) {missing} exited without reporting a result")
    return [r.result for r in results]


def lockstep(
    variants: dict[str, Callable[[], Any]],
    *,
    trials: int,
    inner: int,
    warmup: int = 2,
    barrier: Callable[[], Any],
) -> dict[str, list[float]]:
    """Per-call seconds of every variant, `trials` blocks of `inner` calls each, round-robin.

    Every rank must call this with the same variants and counts: `barrier()` (a raw collective,
    untimed) runs before each block. Even trials run the variants in order, odd trials reversed;
    the GC is off inside blocks and collected every 10th trial (untimed).
    """

    def block(fn: Callable[[], Any]) -> float:
        barrier()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - start) / inner

    return round_robin(variants, trials=trials, warmup=warmup, time_one=block)


def worker_setup() -> None:
    """One intra-op thread per worker (2 workers on a small machine)."""
    import torch

    torch.set_num_threads(1)


def parse_multi_worker_args(
    doc: str, argv: list[str] | None, *, timeout: float, timeout_help: str
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse a multi-worker benchmark's options (`--quick`, `--threads`, `--timeout`).

    `--threads` is accepted (`run_all.py` passes it to every benchmark) and ignored: the
    workers use one thread each. Returns the options and the parent's `environment()`.
    """
    parser = benchmark_parser(doc)
    parser.add_argument("--quick", action="store_true", help="few trials (smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="ignored: workers use 1 thread")
    parser.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    return parser.parse_args(argv), environment()


def machine_line(env: dict[str, Any], extra: str = "") -> str:
    """The second header line of a multi-worker benchmark: cores, load (, `extra`)."""
    cores, load = env["cpu_count"], env["loadavg_at_start"]
    return f"cpu_count {cores}, load {load}{extra}; times are rank 0's"


def rank_summaries(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """`summarize` of every variant of one rank's samples."""
    return {name: summarize(s) for name, s in samples.items()}


if __name__ == "__main__":
    print(__doc__.splitlines()[0], file=sys.stderr)
    sys.exit(2)
