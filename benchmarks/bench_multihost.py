"""Across namespace hosts: nbdist's all-reduce vs raw gloo, on a free and a 100 Mbit/s link,
and the start-up of 4 engines on 2 hosts over ssh.

Hosts: `nbdist.testing.hosts` (network namespaces on a bridge, veth links, 198.18.0.0/24; needs
root and `ip netns`, else the run says why and stops). Two phases:

1. All-reduce: one gloo worker on each of h1 and h2 (torchrun variables, rendezvous on h1,
   `nd.MultiWorkerMirroredStrategy()`, one torch thread each). For float32 tensors of 4 KiB,
   1 MiB and 16 MiB, interleaved block by block: `nbdist` (`strategy.run` of
   `ReplicaContext.all_reduce`) and `raw` (`torch.distributed.all_reduce`), as in
   bench_multi_worker_allreduce.py but between two network stacks. Then the same with h2's link
   limited to 100 Mbit/s by `tc`'s token bucket (both directions): nbdist must reach the link's
   rate (throughput ratio raw/nbdist, and nbdist's MB/s against 12.5 MB/s).
2. Start-up: `nd.Cluster(hosts="h1:2,h2:2", launcher="ssh").start()` to ready, run on the
   notebook's host `nb` (a Python process there), then stopped.

Targets as on one host: throughput raw/nbdist >= 0.95 from 1 MiB, latency nbdist/raw <= 1.15
at 4 KiB (free link). The start-up has no target (it is mostly ipyparallel's ssh launcher,
which starts engines one after another). Every process started here runs in the namespaces
and is stopped with them (by pid).

Run (as root): `python benchmarks/bench_multihost.py [--quick]` (~3 min on 2 cores).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import check, finish, fmt_time, median, paired_ratios, table
from bench_multi_worker_common import (
    lockstep,
    machine_line,
    parse_multi_worker_args,
    rank_summaries,
    worker_setup,
)

NAME = "multihost"
HERE = Path(__file__).resolve().parent
KIB = 1024
SIZES = [4 * KIB, 1024 * KIB, 16384 * KIB]
PLAN = {4 * KIB: (16, 16), 1024 * KIB: (4, 12), 16384 * KIB: (1, 8)}  # size: (inner, trials)
SLOW_PLAN = {4 * KIB: (8, 6), 1024 * KIB: (2, 4), 16384 * KIB: (1, 2)}
RATE = "100mbit"
RATE_BYTES_S = 100e6 / 8
THROUGHPUT_TARGET = 0.95
LATENCY_TARGET = 1.15
PORT = 29500  # free: each host has its own network stack


def _label(nbytes: int) -> str:
    return f"{nbytes // (1024 * KIB)} MiB" if nbytes >= 1024 * KIB else f"{nbytes // KIB} KiB"


def worker(params: dict[str, Any]) -> dict[str, Any]:
    """One rank (on its host): time both variants at every size."""
    worker_setup()
    import torch
    import torch.distributed as dist

    import nbdist as nd

    strategy = nd.MultiWorkerMirroredStrategy()
    strategy.extended.telemetry.enabled = False

    def reduce_step(t: torch.Tensor) -> torch.Tensor:
        return nd.get_replica_context().all_reduce("sum", t)

    ones = torch.full((1024,), float(dist.get_rank() + 1))
    assert torch.equal(strategy.run(reduce_step, args=(ones,)), torch.full((1024,), 3.0))
    out: dict[str, Any] = {"samples": {}}
    for nbytes in params["sizes"]:
        inner, trials = params["plan"][str(nbytes)]
        tensor = torch.zeros(nbytes // 4)
        variants = {
            "nbdist": lambda t=tensor: strategy.run(reduce_step, args=(t,)),
            "raw": lambda t=tensor: dist.all_reduce(t),
        }
        out["samples"][str(nbytes)] = lockstep(
            variants, trials=trials, inner=inner, barrier=dist.barrier
        )
    strategy.shutdown()
    return out


def run_pair(hosts: Any, plan: dict[int, tuple[int, int]], timeout: float) -> list[dict]:
    """`worker` on h1 (rank 0) and h2 (rank 1); their results."""
    params = {"sizes": SIZES, "plan": {str(k): list(v) for k, v in plan.items()}}
    code = (
        f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import bench_multihost as b; "
        f"print('RESULT ' + json.dumps(b.worker(json.loads({json.dumps(params)!r}))))"
    )
    processes = []
    for rank, name in enumerate(("h1", "h2")):
        env = {
            **os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": hosts.hosts["h1"].address,
            "MASTER_PORT": str(PORT), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
            # a host's own name resolves to 127.0.1.1 there (Note [Own name] in
            # nbdist.testing.hosts): gloo needs its interface named, as nd.Cluster's engines do
            "GLOO_SOCKET_IFNAME": "eth0",
        }  # fmt: skip
        env.pop("TF_CONFIG", None)
        processes.append(
            hosts.popen(name, [sys.executable, "-c", code], env=env, cwd=str(HERE),
                        stdout=-1, stderr=-1, text=True)
        )
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=timeout)
        except BaseException:
            for other in processes:
                other.kill()
                other.wait(timeout=30)
            raise
        found = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if process.returncode != 0 or not found:
            raise RuntimeError(f"a worker failed ({process.returncode}):\n{err[-3000:]}")
        results.append(json.loads(found[-1][len("RESULT ") :]))
    return results


def start_up(hosts: Any, folder: Path, timeout: float) -> float:
    """Seconds from `Cluster(...).start()` to ready, for 4 engines on h1 and h2 over ssh."""
    config = str(hosts.ssh_config)
    script = f"""
import sys, time
from nbdist.cluster import Cluster
options = {{"ssh_args": ["-F", {config!r}], "scp_args": ["-F", {config!r}],
           "remote_python": sys.executable, "remote_profile_dir": {str(folder / "remote")!r}}}
cluster = Cluster(hosts="h1:2,h2:2", launcher="ssh", timeout={timeout}, launcher_options=options)
began = time.perf_counter()
cluster.start()
print("START", time.perf_counter() - began, flush=True)
cluster.stop()
"""
    env = {**os.environ, "IPYTHONDIR": str(folder / "ipython")}
    done = hosts.run("nb", [sys.executable, "-c", script], timeout=timeout + 60, env=env)
    return float(next(line for line in done.stdout.splitlines() if line.startswith("START"))
                 .split()[1])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args, env = parse_multi_worker_args(
        __doc__, argv, timeout=300.0, timeout_help="seconds for the workers / the start"
    )
    from nbdist.testing.hosts import HostCluster, skip_reason

    reason = skip_reason()
    if reason:
        print(f"{NAME}: cannot make namespace hosts here: {reason}", file=sys.stderr)
        return 2
    plan = {k: (inner, 3 if args.quick else trials) for k, (inner, trials) in PLAN.items()}
    slow_plan = {k: (inner, 2 if args.quick else t) for k, (inner, t) in SLOW_PLAN.items()}
    import tempfile

    hosts = HostCluster(2).up()
    try:
        free = run_pair(hosts, plan, args.timeout)
        hosts.limit_rate("h2", RATE)
        try:
            slow = run_pair(hosts, slow_plan, args.timeout)
        finally:
            hosts.limit_rate("h2", None)
        with tempfile.TemporaryDirectory(prefix="nbdist-bench-multihost-") as folder:
            start_s = start_up(hosts, Path(folder), args.timeout)
    finally:
        hosts.close()

    print(f"== {NAME}: 2 gloo workers on 2 namespace hosts (veth + bridge), 1 thread each")
    print(machine_line(env))
    rows, ratios, stats = [], {}, {}
    for label, runs in (("free", free), (RATE, slow)):
        samples = runs[0]["samples"]
        for nbytes in SIZES:
            nb, raw = samples[str(nbytes)]["nbdist"], samples[str(nbytes)]["raw"]
            key = f"{label} {nbytes}"
            ratios[key] = {
                "throughput_ratio_of_medians": median(raw) / median(nb),
                "throughput_ratio_paired": median(paired_ratios(raw, nb)),
                "latency_ratio_of_medians": median(nb) / median(raw),
                "nbdist_mb_s": nbytes / median(nb) / 1e6,
                "raw_mb_s": nbytes / median(raw) / 1e6,
            }
            stats[key] = rank_summaries(samples[str(nbytes)])
            r = ratios[key]
            rows.append([
                label, _label(nbytes), fmt_time(median(nb)), fmt_time(median(raw)),
                f"{r['nbdist_mb_s']:.1f}", f"{r['raw_mb_s']:.1f}",
                f"{r['throughput_ratio_of_medians']:.3f}",
            ])  # fmt: skip
    print(table(["link", "size", "nbdist", "raw", "nbdist MB/s", "raw MB/s", "raw/nbdist"], rows))
    print(f"\nlink limit {RATE}: {RATE_BYTES_S / 1e6:.1f} MB/s")
    print(f"start-up, 4 engines on h1, h2 over ssh: {start_s:.1f} s\n")
    checks = [
        check("latency nbdist / raw at 4 KiB (free link)",
              ratios[f"free {4 * KIB}"]["latency_ratio_of_medians"], "<=", LATENCY_TARGET),
    ]  # fmt: skip
    for label in ("free", RATE):
        for nbytes in SIZES[1:]:
            checks.append(
                check(f"throughput nbdist / raw at {_label(nbytes)} ({label})",
                      ratios[f"{label} {nbytes}"]["throughput_ratio_of_medians"], ">=",
                      THROUGHPUT_TARGET,
                      cross_check=ratios[f"{label} {nbytes}"]["throughput_ratio_paired"])
            )  # fmt: skip
    return finish(
        NAME,
        checks,
        {
            "description": "all_reduce across 2 namespace hosts, nbdist vs raw gloo, free and "
            f"{RATE} link; ssh start-up of 4 engines on 2 hosts",
            "environment": env,
            "parameters": {"sizes_bytes": SIZES, "plan": plan, "slow_plan": slow_plan,
                           "rate": RATE, "workers": 2, "backend": "gloo"},
            "variants": stats,
            "ratios": ratios,
            "ssh_start_4_engines_2_hosts_s": start_s,
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
