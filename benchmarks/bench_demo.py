"""`nbdist demo` wall time by phase, and its training speed against hand-written DDP.

Each round runs, in alternating order, (a) the demo on 2 engines (`run_demo`: engine start,
first step, training, stop) and (b) the same CNN, data, global batch (64), optimizer, epochs
and per-epoch evaluation written by hand with `DistributedDataParallel`, 2 gloo ranks under
`torchrun` on the same cores. Training steps/s = steps / training seconds (first step to the
last epoch's evaluation, both sides). Target: nbdist >= 0.9× DDP's steps/s.

    python benchmarks/bench_demo.py --rounds 3 --epochs 6

Prints a table and writes benchmarks/results/demo.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DDP_SCRIPT = r"""
import json, os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from nbdist.app.data import load_digits
from nbdist.app.training import GLOBAL_BATCH_SIZE, LEARNING_RATE, build_model

epochs = int(sys.argv[1])
torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = load_digits(0)
model = DDP(build_model())
opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
steps = 0
start = time.perf_counter()
for epoch in range(1, epochs + 1):
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(epoch))
    for idx in order.split(GLOBAL_BATCH_SIZE):
        mine = idx[rank::size]
        x, y = data.x_train[mine], data.y_train[mine]
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        loss = losses.sum() * size / GLOBAL_BATCH_SIZE
        opt.zero_grad(); loss.backward(); opt.step()
        totals = torch.stack([losses.detach().sum(), torch.tensor(float(len(mine)))])
        dist.all_reduce(totals)
        steps += 1
    with torch.no_grad():
        x, y = data.x_test[rank::size], data.y_test[rank::size]
        score = torch.stack([(model(x).argmax(1) == y).sum().float(), torch.tensor(float(len(y)))])
    dist.all_reduce(score)
seconds = time.perf_counter() - start
if rank == 0:
    accuracy = float(score[0] / score[1])
    print("RESULT", json.dumps({"steps": steps, "seconds": seconds, "accuracy": accuracy}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(epochs: int, folder: Path) -> dict:
    script = folder / "ddp_digits.py"
    script.write_text(DDP_SCRIPT)
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script),
         str(epochs)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    # A result counts even when a rank then died in gloo's teardown ("terminate called without
    # an active exception" in destroy_process_group, seen on a loaded machine): it was measured.
    if line is None:
        raise RuntimeError(f"the DDP run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(line.split(" ", 1)[1])


def run_nbdist(epochs: int, folder: Path) -> dict:
    from nbdist.app.engine_demo import run_demo

    started = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        metrics = run_demo(2, epochs, folder / "demo", progress=False, stdout=quiet)
    metrics["wall"] = time.perf_counter() - started
    return metrics


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args(argv)
    demo_runs, ddp_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("nbdist", "ddp") if r % 2 == 0 else ("ddp", "nbdist")
            for side in order:
                if side == "nbdist":
                    demo_runs.append(run_nbdist(args.epochs, Path(tmp)))
                else:
                    ddp_runs.append(run_ddp(args.epochs, Path(tmp)))
    med = statistics.median
    phases = {k: med(m["timings"][k] for m in demo_runs)
              for k in ("start", "first_step", "training", "stop", "total")}  # fmt: skip
    nb_sps = [m["steps"] / m["timings"]["training"] for m in demo_runs]
    ddp_sps = [d["steps"] / d["seconds"] for d in ddp_runs]
    paired = [a / b for a, b in zip(nb_sps, ddp_sps)]
    result = {
        "rounds": args.rounds, "epochs": args.epochs, "cpu_count": os.cpu_count(),
        "demo_phases_s": phases, "demo_wall_s": med(m["wall"] for m in demo_runs),
        "demo_accuracy": [m["accuracy"] for m in demo_runs],
        "ddp_accuracy": [d["accuracy"] for d in ddp_runs],
        "nbdist_steps_per_s": med(nb_sps), "ddp_steps_per_s": med(ddp_sps),
        "ratio_of_medians": med(nb_sps) / med(ddp_sps), "median_paired_ratio": med(paired),
        "target": 0.9,
    }  # fmt: skip
    print(f"nbdist demo, 2 engines, {args.epochs} epochs, {args.rounds} rounds (medians)")
    print(f"{'phase':<12} {'seconds':>8}")
    for k, v in phases.items():
        print(f"{k:<12} {v:8.2f}")
    print(f"training steps/s: nbdist {med(nb_sps):7.1f}   DDP (torchrun) {med(ddp_sps):7.1f}")
    print(f"nbdist / DDP: {result['ratio_of_medians']:.3f}× (median of paired: "
          f"{result['median_paired_ratio']:.3f}×; target >= 0.9×)")  # fmt: skip
    from _common import write_result

    write_result("demo", result)
    return result


if __name__ == "__main__":
    main()
