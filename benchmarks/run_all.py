"""Run every benchmark in its own process, print its tables, then one summary table.

Writes `benchmarks/results/summary.json`. Benchmarks are not tests: a missed target is marked
MISS but the exit status stays 0; it is 1 only when a benchmark crashed or wrote no result.

Run: `python benchmarks/run_all.py [--quick] [--threads N] [--only NAME ...]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, environment, fmt_value, table, verdict, write_result

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    ("batch_reduce", "bench_batch_reduce.py"),
    ("all_reduce", "bench_all_reduce.py"),
    ("telemetry", "bench_telemetry.py"),
    ("multi_worker_allreduce", "bench_multi_worker_allreduce.py"),
    ("user_collective", "bench_user_collective.py"),
    ("multi_worker_training", "bench_multi_worker_training.py"),
    ("multi_worker_batch_reduce", "bench_multi_worker_batch_reduce.py"),
    ("engines", "bench_engines.py"),
    ("scale", "bench_scale.py"),
    ("checkpoint", "bench_checkpoint.py"),
    ("multi_worker_checkpoint", "bench_multi_worker_checkpoint.py"),
    ("parameter_server", "bench_parameter_server.py"),
    ("dashboard_overhead", "bench_dashboard_overhead.py"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few trials each")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names to run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per benchmark")
    args = parser.parse_args(argv)

    extra = ["--quick"] if args.quick else []
    if args.threads:
        extra += ["--threads", str(args.threads)]
    selected = [(n, f) for n, f in BENCHMARKS if args.only is None or n in args.only]

    rows: list[dict] = []
    runs: list[dict] = []
    crashed = False
    for name, script in selected:
        result_path = RESULTS / f"{name}.json"
        result_path.unlink(missing_ok=True)  # never report a stale result
        command = [sys.executable, str(HERE / script), *extra]
        print(f"$ {' '.join(command)}", flush=True)
        start = time.perf_counter()
        try:
            completed = subprocess.run(command, timeout=args.timeout, check=False)
            returncode = completed.returncode
        except subprocess.TimeoutExpired:
            returncode = None
        elapsed = time.perf_counter() - start
        print(f"[{name}: exit {returncode}, {elapsed:.1f} s]\n", flush=True)
        run = {"benchmark": name, "returncode": returncode, "seconds": round(elapsed, 1)}
        runs.append(run)
        if returncode != 0 or not result_path.exists():
            crashed = True
            reason = "timed out" if returncode is None else f"exit {returncode}"
            rows.append(
                {"benchmark": name, "metric": "(benchmark failed)", "result": "ERROR",
                 "note": reason}
            )  # fmt: skip
            continue
        result = json.loads(result_path.read_text())
        for c in result.get("checks", []):
            rows.append({"benchmark": name, **c, "result": verdict(c)})

    print("== summary")
    env = environment()
    print(
        f"python {env['python']}, torch {env['torch']}, torch threads "
        f"{args.threads or env['torch_num_threads']}, cpu_count {env['cpu_count']}, "
        f"load {env['loadavg_at_start']}"
    )
    summary_rows = [
        [
            r["benchmark"], r["metric"],
            fmt_value(r.get("value"), r.get("unit", "")),
            fmt_value(r.get("cross_check"), r.get("unit", "")),
            r.get("target", ""), r["result"],
        ]
        for r in rows
    ]  # fmt: skip
    print(
        table(["benchmark", "check", "measured", "cross-check", "target", "result"], summary_rows)
    )
    misses = [r for r in rows if r["result"].startswith("MISS")]
    if misses:
        print(f"\n{len(misses)} target(s) MISSED: " + "; ".join(r["metric"] for r in misses))
    noisy = [r for r in rows if r.get("unstable")]
    if noisy:
        print(
            f"{len(noisy)} verdict(s) marked (noisy): the two statistics disagree; rerun on a "
            "quieter machine before trusting them."
        )
    summary = write_result(
        "summary", {"environment": env, "arguments": vars(args), "runs": runs, "checks": rows}
    )
    print(f"wrote {summary}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
