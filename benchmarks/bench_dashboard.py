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

3. Live, under load (`live_under_load`): 2 engines (`%dist start -n 2` in an IPython shell,
   as in a notebook), `--load` busy loops (4) in other processes, a dashboard open on the
   cluster and a `%%distribute` cell training for `--seconds` (20): the period between the
   refresher thread's refreshes while the cell runs (median, 90th percentile, largest; target:
   about 1 s), between refreshes that showed new collectives, and how long after the cell
   started the first refresh showed collectives and metrics (target: under 2 s).

The multi-worker (2 gloo processes) overhead is `bench_dashboard_overhead.py`.

Run: `python benchmarks/bench_dashboard.py [--quick] [--live-only] [--load N] [--seconds S]`;
prints a table, writes benchmarks/results/bench_dashboard.json (the date and the machine in
it).
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import time

import torch

import nbdist as nd
from nbdist.telemetry.metrics import metric_log
from nbdist.telemetry.records import CollectiveRecord, StepRecord
from nbdist.widgets._data import DashboardData
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


def _records(count: int) -> list[CollectiveRecord]:
    return [
        CollectiveRecord("all_reduce:MEAN", 4096 * (1 + i % 8), "local", (0, 1),
                         1000.0 + i * 0.01, 2e-4, (1e-4 * (i % 3), 0.0))
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
    from nbdist.telemetry.records import now
    from nbdist.widgets._canvas import new_figure, png_bytes
    from nbdist.widgets._data import LocalSource

    records = _records(10_000)
    steps = [StepRecord((0, 1), 1000.0 + i * 0.04, 0.03) for i in range(2_500)]
    view = ReductionsView()
    view.update(DashboardData(collectives=records[: -trials - 1], steps=steps))  # warm-up
    times, cpu_times, anchors = [], [], []
    for i in range(trials):
        data = DashboardData(collectives=records[: 10_000 - i], steps=steps)
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
        data = DashboardData(collectives=raw[: len(raw) - i], steps=steps)
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

LIVE_CELL = """
import os, time
rank = int(os.environ["RANK"])
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005)
target = torch.randn(32, 1)

end = time.monotonic() + {seconds}

def step(i):
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1000 * i + rank))
    loss = (model(x) - x @ target).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    late = torch.tensor(float(time.monotonic() > end))
    return loss.detach(), nd.get_replica_context().all_reduce("max", late)

i = 0
while True:  # every engine stops at the same step: the flag is reduced
    loss, done = strategy.run(step, args=(i,))
    nd.log(step=i, loss=loss)
    i += 1
    if done.item():
        break
    time.sleep(0.02)
"""


def _spread(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(values), "median": statistics.median(values),
            "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1]}  # fmt: skip


def live_under_load(seconds: float, load: int) -> dict:
    """The dashboard's refresh period over 2 engines while `load` busy loops run beside it."""
    from IPython.core.interactiveshell import InteractiveShell

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "nbdist")
        shell.run_line_magic("dist", "start -n 2 --timeout 180")
        board = nd.dashboard()
        try:
            load_avg = os.getloadavg()
            started, cpu = time.monotonic(), time.process_time()
            shell.run_cell_magic("distribute", "", LIVE_CELL.format(seconds=seconds))
            ended, cpu = time.monotonic(), time.process_time() - cpu
            during = [h for h in board.history if started <= h[0] <= ended and h[3]]
            times = [h[0] for h in during]
            periods = [b - a for a, b in itertools.pairwise(times)]
            shown = [h for h in during if h[1] > 0]
            new = [b[0] - a[0] for a, b in itertools.pairwise(shown) if b[1] != a[1]]
            first_chart = next((h[0] - started for h in during if h[1] > 0), None)
            first_curve = next((h[0] - started for h in during if h[2] > 0), None)
            # the first collective's start (wall clock, from the records) on the same clock
            to_monotonic = time.monotonic() - time.time()
            shown_ops = board.data.collectives
            first_op = shown_ops[0].start + to_monotonic if shown_ops else None
            after_op = next((h[0] - first_op for h in during if h[1] > 0 and first_op), None)
            return {
                "seconds": ended - started, "load": load, "loadavg_1min": load_avg[0],
                "refreshes": len(during), "period_s": _spread(periods),
                "kernel_cpu_share": cpu / (ended - started),
                "new_collectives_period_s": _spread(new),
                "first_chart_s": first_chart, "first_curve_s": first_curve,
                "first_chart_after_first_collective_s": after_op,
                "first_collective_after_cell_began_s": first_op and first_op - started,
                "refresh_wall_s": _spread([h[4] for h in during]),
                "refresh_cpu_s": _spread([h[5] for h in during]),
            }  # fmt: skip
        finally:
            board.close()
            shell.run_line_magic("dist", "stop")
    finally:
        for process in busy:
            process.kill()
            process.wait(timeout=30)


def _print_live(live: dict) -> None:
    p, n = live["period_s"], live["new_collectives_period_s"]
    print(f"live, {live['load']} busy loops beside 2 engines on {os.cpu_count()} cores "
          f"(1-min load {live['loadavg_1min']:.1f}), {live['seconds']:.1f} s cell, "
          f"{live['refreshes']} refreshes; the kernel process used "
          f"{live['kernel_cpu_share'] * 100:.0f} % of a core")  # fmt: skip
    print(f"{'measure':46} {'median':>8} {'p90':>8} {'max':>8} {'target':>10}")
    for name, d, target in (("refresh period (s)", p, "~1 s"),
                            ("period between new-collective charts (s)", n, "~1 s"),
                            ("one refresh, wall time (s)", live["refresh_wall_s"], ""),
                            ("one refresh, CPU time (s)", live["refresh_cpu_s"], "")):  # fmt: skip
        if d["count"]:
            print(f"{name:46} {d['median']:8.2f} {d['p90']:8.2f} {d['max']:8.2f} {target:>10}")
    for name, key in (("first collective after the cell began (s)",
                       "first_collective_after_cell_began_s"),
                      ("first chart after the first collective (s)",
                       "first_chart_after_first_collective_s"),
                      ("first chart after the cell began (s)", "first_chart_s"),
                      ("first loss curve after the cell began (s)", "first_curve_s")):  # fmt: skip
        value = live[key]
        print(f"{name:46} {value if value is not None else float('nan'):8.2f} {'< 2 s':>28}")



def _option(argv: list[str], name: str, default: float) -> float:
    return float(argv[argv.index(name) + 1]) if name in argv else default


def _write(result: dict) -> None:
    """The JSON under benchmarks/results/, stamped with the date and the machine."""
    from _common import write_result

    print(f"wrote {write_result('bench_dashboard', result)}")


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    metric_log().clear()
    live = live_under_load(_option(argv, "--seconds", 20.0), int(_option(argv, "--load", 4)))
    _print_live(live)
    if "--live-only" in argv:
        _write({"live": live})
        return 0
    result = {
        "live": live,
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
    _write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
