"""Shared helpers for the in-process benchmarks: interleaved timing, tables and JSON results.

Every benchmark compares nbdist against an *anchor* measured in the same process, in the same
run, interleaved with it (the order alternates from trial to trial so slow drift and the other
processes on a shared machine hit both sides alike). Results are medians of repeated trials;
ratios are reported both as the ratio of the medians and as the median of the ratios of paired
trials (a trial of A and a trial of B taken back to back).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def gc_paused(collect: bool = False) -> Iterator[None]:
    """Keep the cyclic garbage collector off inside the block (optionally collect first).

    A full `gc.collect()` costs ~70 ms with torch imported, so callers collect once per trial,
    outside the timed blocks, not once per block.
    """
    was_enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_block(fn: Callable[[], Any], inner: int) -> float:
    """Seconds per call of `fn`, timed over `inner` back-to-back calls with the GC off."""
    with gc_paused():
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - start) / inner


def time_calls(fn: Callable[[], Any], calls: int) -> list[float]:
    """Seconds of each of `calls` calls of `fn`, timed one by one with the GC off."""
    out = []
    with gc_paused():
        clock = time.perf_counter
        for _ in range(calls):
            start = clock()
            fn()
            out.append(clock() - start)
    return out


def interleaved(
    variants: dict[str, Callable[[], Any]], *, trials: int, inner: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Per-call seconds of every variant, `trials` samples each, taken round-robin.

    Even trials run the variants in the given order, odd trials in reverse order.
    """
    return round_robin(
        variants, trials=trials, warmup=warmup, time_one=lambda fn: time_block(fn, inner)
    )


def round_robin(
    variants: dict[str, Callable[[], Any]],
    *,
    trials: int,
    warmup: int,
    time_one: Callable[[Callable[[], Any]], float],
) -> dict[str, list[float]]:
    """`trials` samples of `time_one(fn)` for every variant, after `warmup` untimed calls each.

    Even trials run the variants in the given order, odd trials in reverse order; the GC is off
    inside a trial and collected (untimed) before every 10th one. Shared by `interleaved` and
    the multi-worker `lockstep`.
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
                samples[name].append(time_one(variants[name]))
    return samples


def median(values: list[float]) -> float:
    return statistics.median(values)


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles (both the median for fewer than two values)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def median_ci(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95 % confidence interval of the median (binomial order statistics)."""
    ordered = sorted(values)
    n = len(ordered)
    half = z * (n**0.5) / 2
    lo = max(int(n / 2 - half), 0)
    hi = min(int(n / 2 + half + 1), n - 1)
    return ordered[lo], ordered[hi]


def paired_ratios(numerator: list[float], denominator: list[float]) -> list[float]:
    return [n / d for n, d in zip(numerator, denominator)]


def summarize(samples: list[float]) -> dict[str, float]:
    q1, q3 = quartiles(samples)
    return {
        "median_s": median(samples),
        "q1_s": q1,
        "q3_s": q3,
        "min_s": min(samples),
        "trials": len(samples),
    }


def environment() -> dict[str, Any]:
    """What the numbers depend on: versions, threads, cores and the load when we started."""
    import nbdist

    try:
        load = os.getloadavg()
    except OSError:  # not every platform has it
        load = (float("nan"),) * 3
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "nbdist": getattr(nbdist, "__version__", "?"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def fmt_time(seconds: float) -> str:
    if seconds >= 1e-1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def fmt_iqr(stats: dict[str, float]) -> str:
    """The interquartile range of a `summarize` result, as `q1 .. q3`."""
    return f"{fmt_time(stats['q1_s'])} .. {fmt_time(stats['q3_s'])}"


def summary_row(name: str, stats: dict[str, float]) -> list[str]:
    """A variant's table row from its `summarize` result: name, median, IQR, min."""
    return [name, fmt_time(stats["median_s"]), fmt_iqr(stats), fmt_time(stats["min_s"])]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table with columns padded to fit."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check(
    metric: str,
    value: float,
    op: str,
    threshold: float,
    *,
    unit: str = "x",
    cross_check: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One target: `value op threshold`, with op one of `>=`, `>`, `<=`, `<`.

    `value` is the primary statistic, `cross_check` another estimate of the same thing (ratio of
    medians vs median of paired ratios). When they disagree by more than 20 % the machine was
    too noisy to trust the verdict, and the check says so (`unstable`, printed `(noisy)`).
    """
    compare = {
        ">=": value >= threshold, ">": value > threshold,
        "<=": value <= threshold, "<": value < threshold,
    }  # fmt: skip
    passed = compare[op]
    unstable = False
    if cross_check is not None and value and cross_check:
        unstable = max(value, cross_check) / min(value, cross_check) > 1.2
    return {
        "metric": metric,
        "value": value,
        "cross_check": cross_check,
        "op": op,
        "threshold": threshold,
        "unit": unit,
        "target": f"{op} {threshold:g}{unit}",
        "pass": bool(passed),
        "unstable": unstable,
        "note": note,
    }


def verdict(c: dict[str, Any]) -> str:
    """PASS or MISS, with a `(noisy)` warning when the two statistics disagree."""
    word = "PASS" if c["pass"] else "MISS"
    return f"{word} (noisy)" if c.get("unstable") else word


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    return f"{value:.2f} %" if unit == "%" else f"{value:.3f}{unit}"


def print_checks(checks: list[dict[str, Any]]) -> None:
    rows = [
        [
            c["metric"], fmt_value(c["value"], c["unit"]),
            fmt_value(c.get("cross_check"), c["unit"]), c["target"], verdict(c),
        ]
        for c in checks
    ]  # fmt: skip
    print(table(["check", "measured", "cross-check", "target", "result"], rows))


def ratio_table(rows: list[list[Any]]) -> str:
    """Rows of (name, ratio of medians, median of paired ratios)."""
    return table(
        ["ratio", "ratio of medians (primary)", "paired median (cross-check)"],
        [[name, f"{a:.2f}x", f"{b:.2f}x"] for name, a, b in rows],
    )


def machine() -> dict[str, Any]:
    """Which machine measured: host name, OS, processor, cores and the GPU (if any)."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu,
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write `benchmarks/results/<name>.json`, stamped with the date (UTC) and the machine
    (`machine()`), and return its path. Every benchmark's numbers go there, not into the
    code's Notes (which state what holds, and point at the result files).

    Example:
        write_result("bench_x", {"median_s": 0.012})
        # benchmarks/results/bench_x.json: {"name": "bench_x", "date": "2026-11-27T...",
        #                                   "machine": {...}, "median_s": 0.012}
    """
    import datetime

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    stamp = {
        "name": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    path.write_text(json.dumps({**stamp, **payload}, indent=2, default=str) + "\n")
    return path


def set_threads(threads: int) -> None:
    """Use `threads` intra-op torch threads (0 keeps torch's default)."""
    if threads > 0:
        torch.set_num_threads(threads)


def benchmark_parser(doc: str) -> argparse.ArgumentParser:
    """The argument parser of a benchmark, described by the first line of its docstring."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def parse_in_process_args(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    quick: dict[str, int],
    quick_help: str = "few trials (smoke run)",
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse an in-process benchmark's options; return them and the `environment()`.

    Adds the options every in-process benchmark has after its own: `--quick` (which replaces
    the options named in `quick` by their values there) and `--threads` (applied with
    `set_threads` before the environment is recorded, and so before any timing).
    """
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    env = environment()  # before timing: records the load when we start
    if args.quick:
        for option, value in quick.items():
            setattr(args, option, value)
    return args, env


def finish(name: str, checks: list[dict[str, Any]], payload: dict[str, Any]) -> int:
    """The end of every benchmark's `main`: print the checks, write the JSON result, return 0.

    The result is `payload` with the checks added last (`write_result`).
    """
    print_checks(checks)
    path = write_result(name, {**payload, "checks": checks})
    print(f"wrote {path}")
    return 0
