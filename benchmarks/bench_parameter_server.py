"""ParameterServerStrategy: updates/s with 2 workers vs 1, vs MultiWorkerMirroredStrategy, and
a 100 MB fetch from a ps vs raw gloo point-to-point.

Setup: `nd.Server` task processes on 127.0.0.1 (`nbdist.testing.ps_tasks.TaskProcesses`, one
torch thread each); this process is the chief. The model is the digits classifier of
`examples/parameter_server_digits.py` (`nbdist.app.ps_training`: MLP 64-64-10, SGD lr 0.2,
batches of 64 from each worker's own shuffled copy of the bundled digits data). Parts:

1. **Scaling.** Two clusters side by side, 1 worker + 1 ps and 2 workers + 1 ps, each with its
   own strategy, model and coordinator. A trial schedules `--functions` functions of
   `ps_training.train_steps` (5 SGD steps each: read the model from the ps, 5 steps, push the
   difference: one update) and `join()`s; trials alternate between the clusters (order
   reversed every other trial). Updates/s = functions / seconds. Target: 2 workers >= 1.6x
   the updates/s of 1 worker (issue 11).
2. **Against MultiWorkerMirroredStrategy**, the same model, data, batch and optimizer: 2 gloo
   workers (torchrun variables, one thread each), one synchronous step of 64 examples per
   replica in `strategy.run`. Steps/s (examples/s alongside: a PS step is 64 examples, an MWMS
   step 128) and the time to 90 % test accuracy from fresh weights, evaluated every 3200
   examples on both sides (10 PS functions then `join`, `pull`, evaluate; 25 MWMS steps then
   evaluate on the workers), evaluation included. For information, no target. The PS clusters
   are idle (blocked in a receive) while the MWMS workers run.
3. **Fetch.** A 100 MB float32 `nd.Variable` created in `scope()` lives on a ps process;
   two fetches, each against raw gloo point-to-point of the same bytes between this process and
   a peer process (`dist.send` of an 8-byte request, `dist.recv` of 100 MB) doing the same
   work: `variable.read_value()` on the chief (a new tensor every call) vs raw `recv` into a
   new tensor; and a worker's fetch before each function (the same request, received into the
   buffer of its previous read; called here through the internal `PSClient.read(into=)`) vs
   raw `recv` into one preallocated tensor. (Allocating and first touching 100 MB costs about
   40 ms here, as much as the transfer.) Interleaved call by call (each call timed alone) and
   in bulk (blocks of 5 calls). Target: ps fetch >= 0.8x raw's bytes/s (issue 11).

Run: `python benchmarks/bench_parameter_server.py [--quick]` (~2 min on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    benchmark_parser,
    check,
    environment,
    finish,
    fmt_iqr,
    fmt_time,
    median,
    paired_ratios,
    round_robin,
    summarize,
    table,
    time_block,
)

NAME = "parameter_server"
SCALING_TARGET = 1.6
FETCH_TARGET = 0.8
FETCH_BYTES = 100_000_000
BATCH = 64
STEPS = 5
EVAL_EXAMPLES = 3200  # examples between evaluations on both sides (time to 90 %)
ACCURACY = 0.9
HERE = Path(__file__).resolve().parent

_PEER = """
import os, sys, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0,
                        world_size=2)
data = torch.randn(int(sys.argv[2]) // 4)
request = torch.zeros(1, dtype=torch.int64)
while True:
    dist.recv(request, 1)
    if int(request) < 0:
        break
    dist.send(data, 1)
dist.destroy_process_group()
"""


# -- part 3: fetch ---------------------------------------------------------------------------------
def fetch(trials: int, bulk_trials: int, inner: int) -> dict[str, Any]:
    """ps `read_value()` of 100 MB vs raw gloo send/recv of the same bytes, interleaved."""
    import torch
    import torch.distributed as dist

    import nbdist as nd
    from nbdist.testing.ports import free_port
    from nbdist.testing.processes import worker_env
    from nbdist.testing.ps_tasks import TaskProcesses

    port = free_port()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env = worker_env({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    peer = subprocess.Popen(
        [sys.executable, "-c", _PEER, str(port), str(FETCH_BYTES)],
        env=env,
        start_new_session=True,
    )
    try:
        with TaskProcesses(num_workers=1, num_ps=1) as tasks:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2
            )
            strategy = nd.ParameterServerStrategy(tasks.spec)
            try:
                with strategy.scope():
                    variable = nd.Variable(torch.randn(FETCH_BYTES // 4), name="big")
                request = torch.ones(1, dtype=torch.int64)
                buffer = torch.empty(FETCH_BYTES // 4)

                def raw() -> None:
                    dist.send(request, 0)
                    dist.recv(buffer, 0)

                def raw_fresh() -> None:
                    dist.send(request, 0)
                    dist.recv(torch.empty(FETCH_BYTES // 4), 0)

                def ps_read() -> None:
                    variable.read_value()

                # What a worker does before each function: the same request, received into
                # the buffer of its previous read (internal API: workers are not scripted).
                client = strategy.store.client(0)
                shard = variable.variables[0]._ps_id
                reused = [torch.empty(FETCH_BYTES // 4)]

                def ps_read_reused() -> None:
                    reused[0] = client.read([shard], into=reused)[0]

                assert variable.read_value().numel() * 4 == FETCH_BYTES
                ps_read_reused()
                assert reused[0].data_ptr() == client.read([shard], into=reused)[0].data_ptr()
                variants = {
                    "ps read_value": ps_read,
                    "raw gloo, fresh": raw_fresh,
                    "ps read, worker's buffer": ps_read_reused,
                    "raw gloo": raw,
                }
                calls = round_robin(
                    variants, trials=trials, warmup=2, time_one=lambda fn: time_block(fn, 1)
                )
                bulk = round_robin(
                    variants,
                    trials=bulk_trials,
                    warmup=0,
                    time_one=lambda fn: time_block(fn, inner),
                )
            finally:
                strategy.close()
                dist.send(torch.full((1,), -1, dtype=torch.int64), 0)
                dist.destroy_process_group()
        peer.wait(timeout=30)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait(timeout=30)
    return {"calls": calls, "bulk": bulk}


# -- part 1: scaling, and PS time to 90 % ------
def _ps_setup(tasks: Any) -> dict[str, Any]:
    import nbdist as nd
    from nbdist.app import ps_training

    strategy = nd.ParameterServerStrategy(tasks.spec)
    with strategy.scope():
        model = ps_training.build_model()
    coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
    data = coordinator.create_per_worker_dataset(ps_training.dataset_fn(batch_size=BATCH))
    return {"strategy": strategy, "model": model, "coordinator": coordinator, "it": iter(data)}


def _ps_trial(setup: dict[str, Any], functions: int) -> float:
    from nbdist.app import ps_training

    coordinator, model, it = setup["coordinator"], setup["model"], setup["it"]
    start = time.perf_counter()
    values = [
        coordinator.schedule(ps_training.train_steps, args=(model, it, STEPS))
        for _ in range(functions)
    ]
    coordinator.join()
    seconds = time.perf_counter() - start
    setup.setdefault("workers_used", set()).update(v.worker for v in values)
    return seconds / functions  # seconds per update


def _ps_time_to_accuracy(setup: dict[str, Any], seed: int, max_rounds: int) -> dict[str, Any]:
    """Fresh weights; rounds of EVAL_EXAMPLES examples, then join, pull and evaluate."""
    from nbdist.app import ps_training

    strategy, coordinator, it = setup["strategy"], setup["coordinator"], setup["it"]
    with strategy.scope():
        model = ps_training.build_model(seed=seed)
    per_round = EVAL_EXAMPLES // (BATCH * STEPS)
    start = time.perf_counter()
    accuracy, rounds = 0.0, 0
    while rounds < max_rounds:
        rounds += 1
        for _ in range(per_round):
            coordinator.schedule(ps_training.train_steps, args=(model, it, STEPS))
        coordinator.join()
        accuracy = ps_training.evaluate(strategy.pull(model))
        if accuracy >= ACCURACY:
            break
    return {
        "seconds": time.perf_counter() - start,
        "examples": rounds * EVAL_EXAMPLES,
        "accuracy": accuracy,
        "reached": accuracy >= ACCURACY,
    }


def scaling(trials: int, functions: int, reps: int, max_rounds: int) -> dict[str, Any]:
    """Updates/s of 1 and 2 workers (interleaved trials), then time to 90 % for each."""
    from nbdist.testing.ps_tasks import TaskProcesses

    with (
        TaskProcesses(num_workers=1, num_ps=1) as one,
        TaskProcesses(num_workers=2, num_ps=1) as two,
    ):
        setups = {"1 worker": _ps_setup(one), "2 workers": _ps_setup(two)}
        try:
            samples = round_robin(
                {name: (lambda s=s: _ps_trial(s, functions)) for name, s in setups.items()},
                trials=trials,
                warmup=1,
                time_one=lambda fn: fn(),
            )
            to_accuracy: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
            for rep in range(reps):
                names = list(setups) if rep % 2 == 0 else list(setups)[::-1]
                for name in names:
                    to_accuracy[name].append(
                        _ps_time_to_accuracy(setups[name], seed=rep + 1, max_rounds=max_rounds)
                    )
            used = {name: sorted(s.get("workers_used", ())) for name, s in setups.items()}
        finally:
            for setup in setups.values():
                setup["coordinator"].shutdown()
                setup["strategy"].close()
    return {"samples": samples, "to_accuracy": to_accuracy, "workers_used": used}


# -- part 2: MultiWorkerMirroredStrategy (runs in each of 2 worker processes) ------
def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One MWMS rank: steps/s of the same model and step, then time to 90 % (reps times)."""
    import torch
    import torch.distributed as dist
    from bench_multi_worker_common import lockstep, worker_setup

    worker_setup()
    import nbdist as nd
    from nbdist.app import ps_training

    strategy = nd.MultiWorkerMirroredStrategy()
    rank = dist.get_rank()
    iterator = ps_training.dataset_fn(batch_size=BATCH, seed=rank)()

    def build(seed: int) -> tuple[Any, Any]:
        with strategy.scope():
            model = ps_training.build_model(seed=seed)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        return model, optimizer

    def step(model: Any, optimizer: Any) -> None:
        x, y = next(iterator)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model, optimizer = build(0)
    samples = lockstep(
        {"MWMS step": lambda: strategy.run(step, args=(model, optimizer))},
        trials=params["trials"],
        inner=params["inner"],
        barrier=dist.barrier,
    )
    per_eval = EVAL_EXAMPLES // (2 * BATCH)
    runs = []
    for rep in range(params["reps"]):
        model, optimizer = build(rep + 1)
        dist.barrier()
        start = time.perf_counter()
        accuracy, rounds = 0.0, 0
        while rounds < params["max_rounds"]:
            rounds += 1
            for _ in range(per_eval):
                strategy.run(step, args=(model, optimizer))
            accuracy = ps_training.evaluate(model)
            flag = torch.tensor([1 if accuracy >= ACCURACY else 0])
            dist.broadcast(flag, 0)  # rank 0 decides: both stop together
            if int(flag):
                break
        runs.append(
            {
                "seconds": time.perf_counter() - start,
                "examples": rounds * EVAL_EXAMPLES,
                "accuracy": accuracy,
                "reached": accuracy >= ACCURACY,
            }
        )
    strategy.shutdown()
    return {"samples": samples, "to_accuracy": runs}


def mwms(trials: int, inner: int, reps: int, max_rounds: int, timeout: float) -> list[Any]:
    from bench_multi_worker_common import launch

    params = {"trials": trials, "inner": inner, "reps": reps, "max_rounds": max_rounds}
    return launch("bench_parameter_server", params, timeout=timeout)


# -- report ------
def _accuracy_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    reached = [r for r in runs if r["reached"]]
    return {
        "runs": runs,
        "reached": f"{len(reached)}/{len(runs)}",
        "median_s": median([r["seconds"] for r in reached]) if reached else None,
        "median_examples": median([r["examples"] for r in reached]) if reached else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="few trials (smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="ignored: tasks use 1 thread")
    parser.add_argument("--functions", type=int, default=40, help="functions per scaling trial")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for MWMS workers")
    args = parser.parse_args(argv)
    env = environment()
    quick = args.quick
    plan = {
        "scaling_trials": 4 if quick else 12,
        "functions": 20 if quick else args.functions,
        "reps_to_accuracy": 1 if quick else 3,
        "max_rounds": 40,
        "mwms_trials": 4 if quick else 15,
        "mwms_inner": 25,
        "fetch_trials": 4 if quick else 20,
        "fetch_bulk_trials": 2 if quick else 6,
        "fetch_inner": 5,
    }
    fetched = fetch(plan["fetch_trials"], plan["fetch_bulk_trials"], plan["fetch_inner"])
    scaled = scaling(
        plan["scaling_trials"], plan["functions"], plan["reps_to_accuracy"], plan["max_rounds"]
    )
    mirrored = mwms(
        plan["mwms_trials"],
        plan["mwms_inner"],
        plan["reps_to_accuracy"],
        plan["max_rounds"],
        args.timeout,
    )

    load = env["loadavg_at_start"]
    print(f"== {NAME}: nd.Server tasks on 127.0.0.1, 1 torch thread each; chief = this process")
    print(f"cpu_count {env['cpu_count']}, load {load}; digits MLP 64-64-10, batch {BATCH}")
    one, two = scaled["samples"]["1 worker"], scaled["samples"]["2 workers"]
    mw = mirrored[0]["samples"]["MWMS step"]
    rows = [
        [
            f"PS, {name}", fmt_time(median(s)), f"{1 / median(s):.1f}",
            f"{STEPS / median(s):.0f}", f"{STEPS * BATCH / median(s):.0f}", fmt_iqr(summarize(s)),
        ]
        for name, s in scaled["samples"].items()
    ]  # fmt: skip
    rows.append(
        ["MWMS, 2 workers", "", "", f"{1 / median(mw):.0f}", f"{2 * BATCH / median(mw):.0f}",
         f"{fmt_iqr(summarize(mw))} per step"]
    )  # fmt: skip
    print(table(["training", "time/update", "updates/s", "steps/s", "examples/s", "IQR"], rows))
    scale = median(one) / median(two)
    scale_paired = median(paired_ratios(one, two))
    print(f"2 workers / 1 worker updates/s: {scale:.2f}x (paired {scale_paired:.2f}x)")
    print(f"workers used: {scaled['workers_used']}\n")

    accuracy = {
        f"PS, {name}": _accuracy_summary(runs) for name, runs in scaled["to_accuracy"].items()
    }
    accuracy["MWMS, 2 workers"] = _accuracy_summary(mirrored[0]["to_accuracy"])
    print(
        table(
            ["time to 90 % test accuracy", "median", "examples", "reached", "each run"],
            [[name, fmt_time(a["median_s"]) if a["median_s"] else "-",
              f"{a['median_examples']:.0f}" if a["median_examples"] else "-", a["reached"],
              ", ".join(f"{r['seconds']:.2f} s" for r in a["runs"])]
             for name, a in accuracy.items()],
        )
    )  # fmt: skip
    print()

    fetch_rows, fetch_stats = [], {}
    for mode, samples in (("call by call", fetched["calls"]), ("bulk (5 calls)", fetched["bulk"])):
        fetch_stats[mode] = {name: summarize(s) for name, s in samples.items()}
        for name, s in samples.items():
            fetch_rows.append(
                [mode, name, fmt_time(median(s)), f"{FETCH_BYTES / median(s) / 1e9:.2f} GB/s",
                 fmt_iqr(summarize(s))]
            )  # fmt: skip
    print(table(["100 MB fetch", "variant", "time/call", "throughput", "IQR"], fetch_rows))
    ratios: dict[str, Any] = {
        "updates_per_s_2_over_1_of_medians": scale,
        "updates_per_s_2_over_1_paired": scale_paired,
        "ps_updates_per_s_2_workers": 1 / median(two),
        "mwms_steps_per_s": 1 / median(mw),
    }
    checks = [
        check("PS updates/s, 2 workers / 1 worker", scale, ">=", SCALING_TARGET,
              cross_check=scale_paired)
    ]  # fmt: skip
    for mode, key in (("call by call", "calls"), ("bulk", "bulk")):
        pairs = (
            ("ps read_value", "raw gloo, fresh", "new tensor"),
            ("ps read, worker's buffer", "raw gloo", "reused tensor"),
        )
        for ours, anchor, label in pairs:
            ps, raw = fetched[key][ours], fetched[key][anchor]
            of_medians, paired = median(raw) / median(ps), median(paired_ratios(raw, ps))
            slug = label.replace(" ", "_")
            ratios[f"fetch_{key}_ps_over_raw_{slug}_of_medians"] = of_medians
            ratios[f"fetch_{key}_ps_over_raw_{slug}_paired"] = paired
            print(f"{ours} / {anchor} bytes/s, {mode}: {of_medians:.2f}x (paired {paired:.2f}x)")
            checks.append(
                check(f"100 MB ps fetch / raw gloo bytes/s ({label}), {mode}", of_medians, ">=",
                      FETCH_TARGET, cross_check=paired)
            )  # fmt: skip
    print()
    return finish(
        NAME,
        checks,
        {
            "description": "ParameterServerStrategy: 2 vs 1 worker updates/s, vs MWMS, "
            "100 MB ps fetch vs raw gloo",
            "environment": env,
            "parameters": {**plan, "batch": BATCH, "steps_per_function": STEPS,
                           "eval_every_examples": EVAL_EXAMPLES, "fetch_bytes": FETCH_BYTES,
                           "model": "MLP 64-64-10", "optimizer": "SGD(lr=0.2)"},
            "scaling": {name: summarize(s) for name, s in scaled["samples"].items()},
            "scaling_samples": scaled["samples"],
            "workers_used": scaled["workers_used"],
            "mwms": {
                "rank0": summarize(mw),
                "rank1": summarize(mirrored[1]["samples"]["MWMS step"]),
            },
            "time_to_accuracy": accuracy,
            "fetch": fetch_stats,
            "ratios": ratios,
        },
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
