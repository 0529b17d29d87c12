"""Start-up of 4 engines on 2 namespace hosts by ssh, MPI and Slurm (needs root).

On the namespace hosts of `nbdist.testing.hosts` (nb, h1, h2: each its own network stack and
hostname, joined by a bridge, 198.18.0.0/24) with a real Slurm on them
(`nbdist.testing.slurm`: slurmctld on nb, a slurmd on h1 and h2), a real kernel on nb times
`nd.Cluster(...).start()` for 4 engines on h1 and h2, then `stop()`:

- ssh: `hosts="h1:2,h2:2", launcher="ssh"` (the anchor: the launcher the others are compared
  with, measured in the same run, interleaved);
- mpi: `hosts="h1:2,h2:2", launcher="mpi"`: Open MPI's `mpiexec --host` over ssh;
- slurm: `launcher="slurm", n=4`: one `sbatch` job, `srun` places 2 engines on each node.

The launchers run in turn, the order reversed every trial; the kernel has imported nbdist,
torch and ipyparallel before the first trial, so the times are the clusters' own (controller,
engine processes, registration, the gloo group). Reported: the median, quartiles and minimum
of each launcher's start and stop, and its ratio to ssh's start. The machine is shared: the
1-minute load average is recorded beside the figures.

Run (as root): `python benchmarks/bench_multihost_launchers.py [--trials 3] [--quick]`
(~3 min at 3 trials on 2 cores). Writes `benchmarks/results/bench_multihost_launchers.json`.
Every process is stopped by pid when it ends (the hosts are removed).
"""

from __future__ import annotations

import ast
import os
import sys
import tempfile
from pathlib import Path

from _common import (
    benchmark_parser,
    check,
    environment,
    finish,
    fmt_time,
    median,
    summarize,
    summary_row,
    table,
)

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster, skip_reason
from nbdist.testing.slurm import skip_reason as slurm_skip_reason
from nbdist.testing.slurm import slurm_cluster

NAME = "bench_multihost_launchers"
START_S = 240


def cluster_lines(hosts: HostCluster, folder: Path) -> dict[str, str]:
    """The `nd.Cluster(...)` of each launcher, as code for the kernel on nb."""
    config = hosts.ssh_config
    ssh_options = (
        f"{{'ssh_args': ['-F', '{config}'], 'scp_args': ['-F', '{config}'], "
        f"'remote_python': {sys.executable!r}, "
        f"'remote_profile_dir': '{folder / 'remote-profile'}'}}"
    )
    mpi_options = f"{{'mpi_args': ['--mca', 'plm_rsh_agent', 'ssh -F {config}']}}"
    return {
        "ssh": f"nd.Cluster(hosts='h1:2,h2:2', launcher='ssh', timeout={START_S}, "
        f"launcher_options={ssh_options})",
        "mpi": f"nd.Cluster(hosts='h1:2,h2:2', launcher='mpi', timeout={START_S}, "
        f"launcher_options={mpi_options})",
        "slurm": f"nd.Cluster(n=4, launcher='slurm', timeout={START_S})",
    }


def one_trial(kernel: HostKernel, code: str) -> tuple[float, float, list[str]]:
    """Start and stop one cluster in the kernel: (start s, stop s, the engines' hosts)."""
    reply = kernel.execute(
        f"c = {code}\n"
        "t0 = time.perf_counter(); c.start(); t1 = time.perf_counter()\n"
        "where = [row.host for row in c.status()]\n"
        "t2 = time.perf_counter(); c.stop(); t3 = time.perf_counter()\n"
        "(t1 - t0, t3 - t2, where)",
        timeout=START_S + 120,
    )
    start_s, stop_s, where = ast.literal_eval(reply["result"])
    return float(start_s), float(stop_s), list(where)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--trials", type=int, default=3, help="starts per launcher")
    parser.add_argument("--quick", action="store_true", help="one start per launcher")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials = 1
    reason = skip_reason() or slurm_skip_reason()
    if reason:
        print(f"{NAME}: cannot run here: {reason}", file=sys.stderr)
        return 2
    env = environment()
    starts: dict[str, list[float]] = {"ssh": [], "mpi": [], "slurm": []}
    stops: dict[str, list[float]] = {name: [] for name in starts}
    loads = []
    folder = Path(tempfile.mkdtemp(prefix="nbdist-bench-multihost-"))
    hosts = HostCluster(2).up()
    try:
        with slurm_cluster(hosts) as slurm:
            kernel_env = {"IPYTHONDIR": str(folder / "ipython"), **slurm.env}
            with HostKernel(hosts, env=kernel_env) as kernel:
                kernel.execute("import time, torch, ipyparallel, nbdist as nd")
                lines = cluster_lines(hosts, folder)
                names = list(lines)
                for trial in range(args.trials):
                    for name in names if trial % 2 == 0 else names[::-1]:
                        start_s, stop_s, where = one_trial(kernel, lines[name])
                        assert sorted(where) == ["h1", "h1", "h2", "h2"], (name, where)
                        starts[name].append(start_s)
                        stops[name].append(stop_s)
                        loads.append(os.getloadavg()[0])
                        print(f"trial {trial} {name:5}: start {start_s:.2f} s, "
                              f"stop {stop_s:.2f} s")  # fmt: skip
    finally:
        hosts.close()
    rows = []
    results = {}
    for name in starts:
        stats = summarize(starts[name])
        stop_stats = summarize(stops[name])
        ratio = stats["median_s"] / median(starts["ssh"])
        results[name] = {"start": stats, "stop": stop_stats, "start_vs_ssh": ratio}
        rows.append([*summary_row(name, stats), fmt_time(stop_stats["median_s"]), f"{ratio:.2f}x"])
    print()
    print("Start-up of 4 engines on 2 namespace hosts (h1:2, h2:2), kernel on nb")
    print(table(["launcher", "start median", "start IQR", "start min", "stop median",
                 "start vs ssh"], rows))  # fmt: skip
    print(f"1-minute load average during the trials: {min(loads):.1f} .. {max(loads):.1f}")
    checks = [
        check(
            "slurm start vs ssh",
            results["slurm"]["start_vs_ssh"],
            "<=",
            2.0,
            note="no target in issue 28; a guard against a launcher gone slow",
        ),
        check(
            "mpi start vs ssh",
            results["mpi"]["start_vs_ssh"],
            "<=",
            2.0,
            note="no target in issue 28; a guard against a launcher gone slow",
        ),
    ]
    payload = {
        "environment": env,
        "trials": args.trials,
        "engines": 4,
        "hosts": ["h1:2", "h2:2"],
        "results": results,
        "samples": {"start": starts, "stop": stops},
        "loadavg_1min": loads,
    }
    return finish(NAME, checks, payload)


if __name__ == "__main__":
    sys.exit(main())
