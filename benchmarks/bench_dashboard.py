"""Cost of the live dashboard (issue 9): training-loop overhead and redraw time.

1. Overhead: a 2-replica `MirroredStrategy` MLP training step (gradients all-reduced, as the
   multi-worker MLP benchmark does) with telemetry on, `nd.log(loss=...)` every step and a live
   dashboard refreshing in its thread ("on") against telemetry off, no `nd.log` and no
   dashboard ("off"). Blocks of steps alternate on/off (order flipped every trial); reported:
   the median over adjacent pairs of on/off - 1 (target: under 3 %).
2. Redraw: one redraw of the reductions view with 10,000 collective records (target: under
   100 ms), next to the anchor of drawing an empty Agg figure to PNG.

Run: `python benchmarks/bench_dashboard.py [--quick]`; prints a table, writes
benchmarks/results/bench_dashboard.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

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

    def block(on: bool) -> float:
        telemetry.enabled = on
        board = Dashboard(strategy, namespace={"model": model}) if on else None
        try:
            start = time.perf_counter()
            for _ in range(steps):
                strategy.run(step, args=(on,))
            return (time.perf_counter() - start) / steps
        finally:
            if board is not None:
                board.close()

    block(True), block(False)  # warm up
    on, off = [], []
    for trial in range(trials):
        for flag in (True, False) if trial % 2 == 0 else (False, True):
            (on if flag else off).append(block(flag))
    ratios = [a / b - 1 for a, b in zip(on, off)]
    return {
        "step_on_s": statistics.median(on),
        "step_off_s": statistics.median(off),
        "overhead": statistics.median(ratios),
        "trials": trials,
        "steps_per_block": steps,
    }


def redraw(trials: int) -> dict:
    from nbdist.widgets._canvas import new_figure, png_bytes

    records = [
        ("all_reduce:MEAN", 4096 * (1 + i % 8), "local", (0, 1), 1000.0 + i * 0.01, 2e-4,
         (1e-4 * (i % 3), 0.0))
        for i in range(10_000)
    ]  # fmt: skip
    steps = [((0, 1), 1000.0 + i * 0.04, 0.03) for i in range(2_500)]
    view = ReductionsView()
    times, anchors = [], []
    for i in range(trials):
        data = {"collectives": records[: 10_000 - i], "steps": steps}
        start = time.perf_counter()
        view.update(data)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        png_bytes(new_figure(9, 5.5))
        anchors.append(time.perf_counter() - start)
    return {
        "redraw_10k_s": statistics.median(times),
        "empty_figure_s": statistics.median(anchors),
        "trials": trials,
    }


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    metric_log().clear()
    result = {
        "overhead": overhead(trials=4 if quick else 12, steps=100 if quick else 300),
        "redraw": redraw(trials=3 if quick else 10),
    }
    o, r = result["overhead"], result["redraw"]
    print(f"{'measure':42} {'value':>12} {'target':>10}")
    print(f"{'training step, dashboard off (ms)':42} {o['step_off_s'] * 1e3:12.3f}")
    print(f"{'training step, telemetry+nd.log+dashboard':42} {o['step_on_s'] * 1e3:12.3f}")
    print(f"{'overhead (median of paired blocks)':42} {o['overhead'] * 100:11.2f}% {'< 3 %':>10}")
    print(f"{'redraw reductions, 10k records (ms)':42} {r['redraw_10k_s'] * 1e3:12.1f} "
          f"{'< 100 ms':>10}")  # fmt: skip
    print(f"{'anchor: empty Agg figure to PNG (ms)':42} {r['empty_figure_s'] * 1e3:12.1f}")
    out = Path(__file__).parent / "results" / "bench_dashboard.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
