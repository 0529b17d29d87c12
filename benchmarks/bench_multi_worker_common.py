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

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import gc_paused

HERE = Path(__file__).resolve().parent


def launch(module: str, params: dict[str, Any], *, timeout: float) -> list[Any]:
    """Run `module.worker(params)` in 2 torchrun-style workers; return each rank's result."""
    from nbdist.testing import assert_all_ok, free_port, run_workers, torchrun_env

    code = f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        import {module} as bench
        report(bench.worker(json.loads({json.dumps(params)!r})))
    """
    port = free_port()
    results = run_workers(
        code, [torchrun_env(rank, 2, port) for rank in range(2)], timeout=timeout, cwd=HERE,
        fail_fast=True,
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
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for trial in range(trials):
        order = names if trial % 2 == 0 else names[::-1]
        with gc_paused(collect=trial % 10 == 0):
            for name in order:
                fn = variants[name]
                barrier()
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter() - start) / inner)
    return samples


def worker_setup() -> None:
    """One intra-op thread per worker (2 workers on a small machine)."""
    import torch

    torch.set_num_threads(1)


if __name__ == "__main__":
    print(__doc__.splitlines()[0], file=sys.stderr)
    sys.exit(2)
