"""The collective recorder on vs off (issue 27): a 4 KiB all-reduce and a training step, 2 gloo
workers.

Setup: 2 worker processes (`nd.MultiWorkerMirroredStrategy()` at its defaults, one CPU
replica and one torch thread each). In the same processes and process group, interleaved
(round-robin, a raw barrier before each timed block):

- `4 KiB all-reduce`: `strategy.run(lambda t: ctx.all_reduce("sum", t), args=(t,))`, 1,024
  float32 values (the hot path of a user collective);
- `training step`: `strategy.run(step)` of the `mlp` model of `bench_multi_worker_training`
  (forward, backward with gradient buckets, SGD step);

each with the recorder on (its default: 2,000 entries) and off (capacity 0: nothing recorded,
no call site looked up). Reported: on / off per workload (ratio of medians, and the median
of paired ratios as a cross-check), target <= 1.01; and the recorder's memory after 10**6
entries (flat: the ring keeps 2,000).

Run: `python benchmarks/bench_recorder.py [--quick]`.
"""

from __future__ import annotations

import sys
import tracemalloc
from typing import Any

from _common import check, finish, fmt_time, median, paired_ratios, table
from bench_multi_worker_common import (
    launch,
    lockstep,
    machine_line,
    parse_multi_worker_args,
    worker_setup,
)

NAME = "recorder"
TARGET = 1.01
# workload: (calls per timed block, trials)
PLAN = {"4 KiB all-reduce": (50, 60), "training step": (5, 40)}
LAUNCHES = 3


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank: time both workloads with the recorder on and off, interleaved."""
    worker_setup()
    import torch
    import torch.distributed as dist
    from bench_multi_worker_training import _batch, _build, _plain_step, _sgd

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()
    recorder = strategy._group.recorder  # the benchmark switches it; users cannot
    capacity = recorder.capacity

    def reduce_step(t: torch.Tensor) -> torch.Tensor:
        return nd.get_replica_context().all_reduce("sum", t)

    tensor = torch.ones(1024)
    x, y = _batch("mlp", dist.get_rank())
    torch.manual_seed(0)
    with strategy.scope():
        model = _build("mlp")
        optimizer = _sgd(model.parameters())

    def switched(on: bool, fn):
        def call() -> Any:
            recorder.capacity = capacity if on else 0
            return fn()

        return call

    workloads = {
        "4 KiB all-reduce": lambda: strategy.run(reduce_step, args=(tensor,)),
        "training step": lambda: strategy.run(_plain_step, args=(model, optimizer, x, y)),
    }
    out: dict[str, Any] = {}
    for name, fn in workloads.items():
        inner, trials = params["plan"][name]
        out[name] = lockstep(
            {"on": switched(True, fn), "off": switched(False, fn)},
            trials=trials, inner=inner, barrier=dist.barrier,
        )  # fmt: skip
    recorder.capacity = capacity
    out["entries"] = len(recorder)
    strategy.shutdown()
    return out


def recorder_memory(collectives: int) -> dict[str, float]:
    """Bytes the recorder holds after `collectives` entries (in this process, no group)."""
    import torch

    from nbdist.collectives.recorder import CollectiveRecorder

    tracemalloc.start()
    recorder = CollectiveRecorder()
    sizes = {}
    for seq in range(1, collectives + 1):
        recorder.begin(seq, "all_reduce:SUM", torch.Size([1024]), torch.float32, 4096, None)
        recorder.end(seq)
        if seq in (10**3, 10**4, 10**5, collectives):
            sizes[str(seq)] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return sizes


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=300.0, timeout_help="seconds per launch"
    )
    plan = {w: [inner, 8 if args.quick else trials] for w, (inner, trials) in PLAN.items()}
    launches = 1 if args.quick else LAUNCHES
    runs = [
        launch("bench_recorder", {"plan": plan}, timeout=args.timeout)[0] for _ in range(launches)
    ]  # rank 0's samples of each launch
    print(f"== {NAME}: the collective recorder on vs off, 2 gloo worker processes")
    print(machine_line(env, f", {launches} launch(es)"))
    rows, checks, ratios = [], [], {}
    for workload in PLAN:
        per_launch = [r[workload] for r in runs]
        launch_ratios = [median(s["on"]) / median(s["off"]) for s in per_launch]
        ratio = median(launch_ratios)
        paired = median([median(paired_ratios(s["on"], s["off"])) for s in per_launch])
        on = [x for s in per_launch for x in s["on"]]
        off = [x for s in per_launch for x in s["off"]]
        # what recording adds per call, in seconds (paired blocks: the load they share cancels)
        added = median([median([a - b for a, b in zip(s["on"], s["off"])]) for s in per_launch])
        rows.append([workload, fmt_time(median(on)), fmt_time(median(off)), f"{ratio:.3f}x",
                     f"{paired:.3f}x", f"{added * 1e6:+.1f} us"])  # fmt: skip
        ratios[workload] = {"ratio_of_medians": ratio, "paired": paired, "added_s": added,
                            "per_launch": launch_ratios}  # fmt: skip
        checks.append(check(f"recorder on / off, {workload}", ratio, "<=", TARGET,
                            cross_check=paired))  # fmt: skip
    print(table(["workload", "on", "off", "on/off", "paired", "on - off"], rows))
    print("(per call; medians of every launch's blocks; ratios: median over launches)")
    memory = recorder_memory(10**5 if args.quick else 10**6)
    print("recorder memory after N collectives (bytes): " + ", ".join(
        f"{n}: {b:,}" for n, b in memory.items()))  # fmt: skip
    sizes = list(memory.values())
    checks.append(check("recorder memory, last / after 10**4 entries", sizes[-1] / sizes[1],
                        "<=", 1.05))  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "collective recorder on vs off: 4 KiB all-reduce, mlp training step",
            "environment": env,
            "parameters": {"plan": plan, "workers": 2, "backend": "gloo", "launches": launches},
            "ratios": ratios,
            "memory_bytes": memory,
            "entries_rank0": [r["entries"] for r in runs],
        },
    )


if __name__ == "__main__":
    sys.exit(main())
