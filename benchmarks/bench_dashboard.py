"""Cost of the live dashboard (issue 9): training-loop overhead and redraw time.

1. Overhead (in-process): a 2-replica `MirroredStrategy` MLP training step (gradients
   all-reduced, as the multi-worker MLP benchmark does) with telemetry on, `nd.log(loss=...)`
   every step and a live dashboard refreshing in its thread ("on") against telemetry off, no
   `nd.log` and no dashboard ("off"). Blocks of steps alternate on/off (order flipped every
   trial); reported: the median over adjacent pairs of on/off - 1 (target: under 3 %), the
   ratio of the medians, the ratio of the medians of the process's CPU time per step (all its
   threads: replicas and refresher; steadier than wall time on a loaded machine), and the
   refresher's CPU time over the on blocks' time (direct).
2. Redraw: one redraw of the reductions view with 10,000 collective records (target: under
   100 ms), next to the anchor of drawing an empty Agg figure to PNG; a million records
   recorded through a strategy's telemetry (memory bounded: resident memory after 10k and after
   1M records; a refresh, collect + redraw, under 200 ms, every record in the view's totals);
   and a million raw records handed to the view at once.

The multi-worker (2 gloo processes) overhead is `bench_dashboard_overhead.py`.

Run: `python benchmarks/bench_dashboard.py [--quick]`; prints a table, writes
benchmarks/results/bench_dashboard.json.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import nbdist as nd
from nbdist.metrics import metric_log
from nbdist.widgets.dashboard import Dashboard
from nbdist.widgets.reductions import ReductionsView


def _trainer():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))

    def step(log: bool) -> None:
        ctx = nd.get_replica_context()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for p, g in zip(model.parameters(), grads):
            g = ctx.all_reduce("mean", g)
            with torch.no_grad():
                p.sub_(0.01 * g)
        if log:
            nd.log(loss=loss.detach())

    return strategy, model, step


def overhead(trials: int, steps: int) -> dict:
    strategy, model, step = _trainer()
    telemetry = strategy.extended.telemetry
    counts = {"refreshes": 0, "refresh_cpu_s": 0.0, "on_s": 0.0}

    cpu: dict[bool, list[float]] = {True: [], False: []}

    def block(on: bool) -> float:
        telemetry.enabled = on
        board = Dashboard(strategy, namespace={"model": model}) if on else None
        first = (board.refreshes, board.busy_cpu_s) if board is not None else (0, 0.0)
        try:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                strategy.run(step, args=(on,))
            elapsed = time.perf_counter() - start
            cpu[on].append((time.process_time() - start_cpu) / steps)
            if board is not None:
                counts["refreshes"] += board.refreshes - first[0]
                counts["refresh_cpu_s"] += board.busy_cpu_s - first[1]
                counts["on_s"] += elapsed
            return elapsed / steps
        finally:
            if board is not None:
                board.close()

    block(True), block(False)  # warm up
    counts.update(refreshes=0, refresh_cpu_s=0.0, on_s=0.0)
    cpu[True].clear(), cpu[False].clear()
    on, off = [], []
    for trial in range(trials):
        for flag in (True, False) if trial % 2 == 0 else (False, True):
            (on if flag else off).append(block(flag))
    ratios = [a / b - 1 for a, b in zip(on, off)]
    return {
        "step_on_s": statistics.median(on),
        "step_off_s": statistics.median(off),
        "overhead": statistics.median(ratios),
        "overhead_of_medians": statistics.median(on) / statistics.median(off) - 1,
        "cpu_overhead_of_medians": statistics.median(cpu[True]) / statistics.median(cpu[False]) - 1,
        "refreshes": counts["refreshes"],
        "refresh_cpu_share": counts["refresh_cpu_s"] / counts["on_s"],
        "trials": trials,
        "steps_per_block": steps,
    }


def _records(count: int) -> list[tuple]:
    return [
        ("all_reduce:MEAN", 4096 * (1 + i % 8), "local", (0, 1), 1000.0 + i * 0.01, 2e-4,
         (1e-4 * (i % 3), 0.0))
        for i in range(count)
    ]  # fmt: skip


def _rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def redraw(trials: int) -> dict:
    """Redraw times of the reductions view: 10k records; 1M records recorded through a
    strategy's telemetry (kept: 10k, the rest folded) then collected and drawn; and 1M raw
    records handed to the view at once."""
    from nbdist.telemetry import now
    from nbdist.widgets._canvas import new_figure, png_bytes
    from nbdist.widgets._data import LocalSource

    records = _records(10_000)
    steps = [((0, 1), 1000.0 + i * 0.04, 0.03) for i in range(2_500)]
    view = ReductionsView()
    view.update({"collectives": records[: -trials - 1], "steps": steps})  # first draw: warm-up
    times, cpu_times, anchors = [], [], []
    for i in range(trials):
        data = {"collectives": records[: 10_000 - i], "steps": steps}
        start, cpu = time.perf_counter(), time.thread_time()
        view.update(data)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu)
        start = time.perf_counter()
        png_bytes(new_figure(9, 5.5))
        anchors.append(time.perf_counter() - start)

    # 1M records through a real strategy's telemetry: memory stays bounded (the oldest are
    # folded into per-op aggregates), a refresh collects and draws what is kept.
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    telemetry = strategy.extended.telemetry
    telemetry.clear()
    source = LocalSource(strategy)
    source.namespace = {}

    def fill(count: int) -> None:
        t = now()
        for i in range(count):
            start = t + i * 1e-4
            arrivals = (start, start + 5e-5) if i % 3 else (start + 5e-5, start)
            telemetry.record_arrivals("all_reduce:SUM", 4096, "local", (0, 1), arrivals,
                                      start + 2e-4)  # fmt: skip

    fill(10_000)
    rss_10k = _rss_bytes()
    fill(990_000)
    rss_1m = _rss_bytes()
    view_1m = ReductionsView()
    view_1m.update(source.collect())
    collected, drawn = [], []
    for _ in range(trials):
        fill(1)  # something new, so the view redraws
        start = time.perf_counter()
        data = source.collect()
        middle = time.perf_counter()
        view_1m.update(data)
        collected.append(middle - start)
        drawn.append(time.perf_counter() - middle)
    accounted = sum(t["count"] for t in view_1m.totals.values())

    raw = _records(1_000_000)
    view_raw = ReductionsView()
    raw_times = []
    for i in range(max(trials // 2, 2)):
        data = {"collectives": raw[: len(raw) - i], "steps": steps}
        start = time.perf_counter()
        view_raw.update(data)
        raw_times.append(time.perf_counter() - start)
    return {
        "redraw_10k_s": statistics.median(times),
        "redraw_10k_cpu_s": statistics.median(cpu_times),
        "empty_figure_s": statistics.median(anchors),
        "telemetry_1m": {
            "kept": len(telemetry),
            "accounted": accounted,
            "rss_after_10k_bytes": rss_10k,
            "rss_after_1m_bytes": rss_1m,
            "collect_s": statistics.median(collected),
            "redraw_s": statistics.median(drawn),
            "refresh_s": statistics.median(c + d for c, d in zip(collected, drawn)),
        },
        "redraw_1m_raw_s": statistics.median(raw_times),
        "trials": trials,
    }


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    metric_log().clear()
    result = {
        "redraw": redraw(trials=3 if quick else 10),
        # Blocks of a few seconds: several dashboard refreshes at the dashboard's own pace.
        "overhead": overhead(trials=4 if quick else 10, steps=1000 if quick else 2000),
    }
    o, r = result["overhead"], result["redraw"]
    m = r["telemetry_1m"]
    print(f"cpu_count {os.cpu_count()}, load {[round(x, 2) for x in os.getloadavg()]}")
    print(f"{'measure':46} {'value':>12} {'target':>10}")
    print(f"{'training step, dashboard off (ms)':46} {o['step_off_s'] * 1e3:12.3f}")
    print(f"{'training step, telemetry+nd.log+dashboard':46} {o['step_on_s'] * 1e3:12.3f}")
    print(f"{'overhead (median of paired blocks)':46} {o['overhead'] * 100:11.2f}% {'< 3 %':>10}")
    print(f"{'overhead (ratio of medians)':46} {o['overhead_of_medians'] * 100:11.2f}%")
    cpu_overhead = o["cpu_overhead_of_medians"] * 100
    print(f"{'process CPU per step (ratio of medians)':46} {cpu_overhead:11.2f}%")
    print(f"{'refresher CPU / on blocks (direct)':46} {o['refresh_cpu_share'] * 100:11.2f}% "
          f"{o['refreshes']:>4} refreshes")  # fmt: skip
    rows = [
        ("redraw reductions, 10k records (ms)", r["redraw_10k_s"] * 1e3, "< 100 ms"),
        ("  its CPU time (thread_time, ms)", r["redraw_10k_cpu_s"] * 1e3, ""),
        ("1M recorded: refresh = collect + redraw (ms)", m["refresh_s"] * 1e3, "< 200 ms"),
        ("  of which collect (ms)", m["collect_s"] * 1e3, ""),
        ("  of which redraw (ms)", m["redraw_s"] * 1e3, ""),
        ("1M recorded: RSS growth 10k -> 1M (MiB)",
         (m["rss_after_1m_bytes"] - m["rss_after_10k_bytes"]) / 2**20, "bounded"),
        ("redraw reductions, 1M raw records (ms)", r["redraw_1m_raw_s"] * 1e3, "< 200 ms"),
        ("anchor: empty Agg figure to PNG (ms)", r["empty_figure_s"] * 1e3, ""),
    ]  # fmt: skip
    for name, value, target in rows:
        print(f"{name:46} {value:12.1f} {target:>10}")
    print(f"1M recorded: {m['kept']} kept, {m['accounted']} accounted for in the view's totals")
    from _common import write_result

    out = write_result("bench_dashboard", result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
