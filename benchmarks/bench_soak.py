"""Soak: 1,000 %%distribute cells and 10,000 small all-reduces on 2 engines; memory, fds, threads.

Not a timed benchmark: it checks that a long notebook session does not leak. An in-process
IPython shell loads nbdist and runs `%dist start -n 2`, then `--cells` trivial `%%distribute`
cells (`x = 1 + 1`) and `--reduce-cells` cells that each run `--reduces-per-cell` small
`dist.all_reduce`s (4 float32 values) on both engines, interleaved. Before (after a short
warm-up of 20 cells of each kind, which loads what the first cells load once) and after, it
records the resident memory (RSS), open file descriptors and threads of the client (this
process) and of each engine. The target (issue 12): the client's and each engine's RSS grow by
less than 50 MB over the whole soak; fds and threads do not grow.

Run: `python benchmarks/bench_soak.py` (defaults: 1,000 cells, 10,000 all-reduces; a few
minutes on 2 cores) or `--quick`. Prints a table, writes `benchmarks/results/bench_soak.json`.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import tempfile
import time

_IPYTHONDIR = tempfile.mkdtemp(prefix="nbdist-soak-ipython-")
os.environ["IPYTHONDIR"] = _IPYTHONDIR

import psutil  # noqa: E402
from _common import benchmark_parser, environment, table, write_result  # noqa: E402

GROWTH_TARGET_MB = 50.0
WARMUP_CELLS = 20
REDUCE_CELL = (
    "import torch, torch.distributed as dist\n"
    "t = torch.ones(4)\n"
    "for _ in range({n}):\n"
    "    dist.all_reduce(t)\n"
    "t = None\n"
)


def snapshot(pid: int) -> dict[str, float]:
    """RSS (MB), open fds and threads of process `pid`."""
    process = psutil.Process(pid)
    return {
        "rss_mb": process.memory_info().rss / 2**20,
        "fds": process.num_fds(),
        "threads": process.num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--cells", type=int, default=1000, help="trivial %%%%distribute cells")
    parser.add_argument("--reduce-cells", type=int, default=100, help="cells of all-reduces")
    parser.add_argument("--reduces-per-cell", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="100 cells, 1,000 all-reduces")
    args = parser.parse_args(argv)
    if args.quick:
        args.cells, args.reduce_cells, args.reduces_per_cell = 100, 10, 100
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        shell.run_line_magic("load_ext", "nbdist")
        shell.run_line_magic("dist", "start -n 2")
    cluster = shell.user_ns["cluster"]
    engines = {f"engine {info.rank}": info.pid for info in cluster.engines}
    pids = {"client": os.getpid(), **engines}
    reduce_cell = REDUCE_CELL.format(n=args.reduces_per_cell)

    def run(cell: str) -> None:
        sink.seek(0)
        sink.truncate()
        with contextlib.redirect_stdout(sink):
            shell.run_cell_magic("distribute", "", cell)

    try:
        for _ in range(WARMUP_CELLS):
            run("x = 1 + 1")
            run(reduce_cell)
        gc.collect()
        before = {name: snapshot(pid) for name, pid in pids.items()}
        begin = time.perf_counter()
        every = max(1, args.cells // max(1, args.reduce_cells))
        reduce_cells_done = 0
        for index in range(args.cells):
            run("x = 1 + 1")
            if index % every == 0 and reduce_cells_done < args.reduce_cells:
                run(reduce_cell)
                reduce_cells_done += 1
        while reduce_cells_done < args.reduce_cells:
            run(reduce_cell)
            reduce_cells_done += 1
        seconds = time.perf_counter() - begin
        gc.collect()
        after = {name: snapshot(pid) for name, pid in pids.items()}
    finally:
        with contextlib.redirect_stdout(sink):
            shell.run_line_magic("dist", "stop")
    rows, results = [], {}
    for name in pids:
        growth = {key: after[name][key] - before[name][key] for key in before[name]}
        results[name] = {"before": before[name], "after": after[name], "growth": growth}
        rows.append([
            name,
            f"{before[name]['rss_mb']:.1f}", f"{after[name]['rss_mb']:.1f}",
            f"{growth['rss_mb']:+.1f}",
            f"{before[name]['fds']:.0f} -> {after[name]['fds']:.0f}",
            f"{before[name]['threads']:.0f} -> {after[name]['threads']:.0f}",
        ])  # fmt: skip
    cells = args.cells + args.reduce_cells
    reduces = args.reduce_cells * args.reduces_per_cell
    print(f"Soak: {cells} %%distribute cells ({reduces} all-reduces of 4 floats) on 2 engines "
          f"in {seconds:.1f} s ({1000 * seconds / cells:.1f} ms per cell)")  # fmt: skip
    print(table(["process", "RSS before MB", "RSS after MB", "growth MB", "fds", "threads"], rows))
    worst = max(result["growth"]["rss_mb"] for result in results.values())
    leaks = [
        name
        for name, result in results.items()
        if result["growth"]["fds"] > 0 or result["growth"]["threads"] > 0
    ]
    ok = worst < GROWTH_TARGET_MB and not leaks
    print(f"largest RSS growth {worst:+.1f} MB (target < {GROWTH_TARGET_MB:.0f} MB); "
          f"fd/thread growth in: {leaks or 'none'} -> {'PASS' if ok else 'FAIL'}")  # fmt: skip
    path = write_result("bench_soak", {
        "environment": environment(),
        "cells": cells, "all_reduces": reduces, "seconds": seconds,
        "growth_target_mb": GROWTH_TARGET_MB, "largest_rss_growth_mb": worst,
        "processes": results, "pass": ok,
    })  # fmt: skip
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
