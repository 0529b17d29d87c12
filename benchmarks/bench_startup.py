"""Start-up: `%load_ext nbdist` + `%dist start -n 2` vs bare ipyparallel and jupyter-distributed.

Every trial runs in a fresh Python process (as a new kernel would), the sides interleaved
trial by trial, and the 1-minute load average is recorded beside every figure (the machine is
shared). Reported, medians of `--trials` (>= 5 by default):

1. side by side, from a fresh process to a first trivial cell done:
   - nbdist: `%load_ext nbdist`, `%dist start -n 2` (to a joined group, `strategy` ready), then a
     `%%distribute` cell `1 + 1` (IPython's InteractiveShell, as in a kernel);
   - ipyparallel: `import ipyparallel`, `Cluster(n=2).start_and_connect_sync()`,
     `wait_for_engines(2)`, then `execute("1 + 1")` on both engines (no torch, no group);
   - jupyter-distributed 0.1.1 (PyPI; two ipykernels started concurrently, no process group):
     `DistributedKernelGroup(2).start()` then `execute("1 + 1")`, run with the Python of a venv
     of its own (`--jd-python`, or made under $TMPDIR from the nbdist venv's packages with
     `pip install --no-deps jupyter-distributed==0.1.1`); reported unavailable if that fails;
2. the stage table of nbdist's start (`cluster.start_report()`: the median of each stage);
3. the curve: `%dist start -n N` and a trivial `%%distribute` cell's latency (median of 5
   cells) for N = 1, 2, 4, 8 on this machine;
4. `--loaded`: 1 again with a busy loop on each core;
5. checks that guard against the regression of 2026-11-24 coming back (the controller imports
   no torch, engines no Dynamo, a 2-engine start uses <= 7 s of CPU) and the issue's targets
   (`%load_ext` <= 0.2 s, start <= 1.5 s on a quiet machine, 8 engines' CPU <= 2x 2 engines').
   A missed target prints MISS; it is not a failure.

Also the CPU seconds the cluster's processes used to start (load-independent, unlike wall time),
and the notebook's own. Local engines are forked from an engine zygote (docs/notebooks.md,
Start-up); unless `--no-baseline`, every figure is also measured with `NBDIST_ZYGOTE=0` (each
engine a Python of its own, importing torch itself), side by side, and the zygote's memory is
recorded.

Run: `python benchmarks/bench_startup.py [--trials 5] [--quick] [--loaded] [--curve 1,2,4,8]`
(~4 min quiet on 2 cores, 15 min at load 20). Writes
`benchmarks/results/bench_startup.json`. Every process a trial starts is stopped by the trial.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import (
    benchmark_parser,
    check,
    environment,
    median,
    print_checks,
    table,
    write_result,
)

_NBDIST = """
import json, os, sys, time, tempfile
os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="nbdist-bench-ipython-")
from IPython.core.interactiveshell import InteractiveShell
import io, contextlib
shell = InteractiveShell.instance()
n, cells = int(sys.argv[1]), int(sys.argv[2])
load = os.getloadavg()[0]
out = io.StringIO()
import resource
def _own_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
cpu_before = _own_cpu()
begin = time.perf_counter()
with contextlib.redirect_stdout(out):
    shell.run_line_magic("load_ext", "nbdist")
    loaded = time.perf_counter()
    shell.run_line_magic("dist", f"start -n {n}")
    ready = time.perf_counter()
    notebook_cpu = _own_cpu() - cpu_before
    cluster = shell.user_ns["cluster"]
    latencies = []
    for _ in range(cells):
        t = time.perf_counter()
        shell.run_cell_magic("distribute", "", "1 + 1")
        latencies.append(time.perf_counter() - t)
    first_cell = ready - begin + latencies[0]
import psutil
cpu = 0.0
for pid in cluster.processes:
    with contextlib.suppress(psutil.Error):
        times = psutil.Process(pid).cpu_times()
        cpu += times.user + times.system
zygote_memory = None
for pid in cluster.processes:  # the engine zygote (its forks are named nbdist-*)
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        zygote = "_zygote_main" in " ".join(process.cmdline())
        if zygote and not process.name().startswith("nbdist-"):
            info = process.memory_full_info()
            zygote_memory = {"rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20}
engine_memory = []
for info in cluster.engines:
    with contextlib.suppress(psutil.Error):
        engine_memory.append(psutil.Process(info.pid).memory_full_info().uss / 2**20)
report = cluster.start_report()
with contextlib.redirect_stdout(io.StringIO()):
    shell.run_line_magic("dist", "stop")
print(json.dumps({
    "load": load, "load_ext": loaded - begin, "start": ready - loaded, "ready": ready - begin,
    "first_cell": first_cell, "cell": sorted(latencies)[len(latencies) // 2],
    "cluster_cpu": cpu, "notebook_cpu": notebook_cpu, "zygote_memory": zygote_memory,
    "engine_uss_mb": engine_memory, "report": report.as_dict(), "output": out.getvalue(),
}))
"""

_IPYPARALLEL = """
import json, os, sys, time, tempfile, logging
os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="nbdist-bench-ipython-")
load = os.getloadavg()[0]
begin = time.perf_counter()
import ipyparallel
cluster = ipyparallel.Cluster(n=2, log_level=logging.WARNING)
client = cluster.start_and_connect_sync()
client.wait_for_engines(2, timeout=300)
ready = time.perf_counter()
client[:].execute("1 + 1", block=True)
done = time.perf_counter()
client.close()
cluster.stop_cluster_sync()
print(json.dumps({"load": load, "ready": ready - begin, "first_cell": done - begin}))
"""

_JUPYTER_DISTRIBUTED = """
import asyncio, json, os, time
load = os.getloadavg()[0]
begin = time.perf_counter()
from jupyter_distributed.kernel_group import DistributedKernelGroup

async def main():
    group = DistributedKernelGroup(2)
    try:
        await group.start()
        ready = time.perf_counter()
        await group.execute("1 + 1")
        return ready, time.perf_counter()
    finally:
        await group.shutdown(now=True)

ready, done = asyncio.run(main())
print(json.dumps({"load": load, "ready": ready - begin, "first_cell": done - begin}))
"""


_GUARD = """
import json, subprocess, sys
controller = subprocess.run([sys.executable, "-c",
    "import sys, nbdist.cluster.launch._controller_main, nbdist.cluster.launch.parent_watch; "
    "print([m for m in ('torch', 'ipyparallel', 'IPython') if m in sys.modules])"],
    capture_output=True, text=True, check=True).stdout.strip()
engine = subprocess.run([sys.executable, "-c",
    "import sys, torch, nbdist.cluster.engine_side.joining, "
    "nbdist.cluster.engine_side.entry_points; "
    "print(int('torch._dynamo' in sys.modules))"],
    capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"controller": eval(controller), "engine_dynamo": int(engine)}))
"""


def _run(
    python: str, code: str, *args: str, timeout: float = 600, zygote: bool = True
) -> dict[str, Any]:
    env = {**os.environ, "NBDIST_ZYGOTE": "1" if zygote else "0"}
    done = subprocess.run(
        [python, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"trial failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _jd_python(given: str | None) -> tuple[str | None, str]:
    """A Python with jupyter-distributed, or None and why not."""
    if given:
        return given, f"given: {given}"
    venv = Path(tempfile.gettempdir()) / "nbdist-bench-jd-venv"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import jupyter_distributed.kernel_group"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return str(python), f"venv {venv}"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        site = next((venv / "lib").glob("python*/site-packages"))
        import sysconfig

        # the nbdist venv's packages (ipykernel, jupyter_client, ...) without copying them
        (site / "nbdist_bench_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "jupyter-distributed==0.1.1"],
            check=True,
            timeout=180,
        )
        subprocess.run(check, check=True, capture_output=True, timeout=120)
    except Exception as error:  # no network, no venv module: reported, not a crash
        return None, f"unavailable: {type(error).__name__}: {error}"
    return str(python), f"venv {venv} (pip install --no-deps jupyter-distributed==0.1.1)"


@contextlib.contextmanager
def _busy_cores():
    """A busy loop on each core (stopped on exit)."""
    stop = multiprocessing.Event()
    workers = [
        multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
        for _ in range(os.cpu_count() or 1)
    ]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()


def _spin(stop: Any) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


NO_ZYGOTE = "nbdist, NBDIST_ZYGOTE=0"
"""The side that starts every engine as a Python of its own (as before the zygote)."""

NO_SPARE = "nbdist, zygote after the imports"
"""The side whose zygote `Cluster.start` launches after the notebook's imports (`%dist start`
launches it before them: does that overlap pay on 2 cores?)."""

_NBDIST_NO_SPARE = _NBDIST.replace(
    "shell = InteractiveShell.instance()",
    "import nbdist.cluster.launch.zygote as _zygote\n"
    "_zygote.start_spare = lambda *args, **kwargs: None\n"
    "shell = InteractiveShell.instance()",
    1,
)


WARM = "nbdist, %dist warm on"
"""The side whose notebook ran `%load_ext nbdist` and `%dist warm on` earlier, and waited for
the warm zygote's and spare controller's imports to end: what a later `%dist start` costs
(its `%load_ext` is then nothing)."""

_NBDIST_WARM = _NBDIST.replace(
    "cpu_before = _own_cpu()",
    "shell.run_line_magic('load_ext', 'nbdist')\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    shell.run_line_magic('dist', 'warm on')\n"
    "import psutil\n"
    "from nbdist.cluster.launch.zygote import spare_controller, warm_zygote\n"
    "for _warm in (psutil.Process(warm_zygote().pid), psutil.Process(spare_controller().pid)):\n"
    "    _used, _until = -1.0, time.monotonic() + 120\n"
    "    while time.monotonic() < _until:  # imports done when its CPU time stops growing\n"
    "        _times = _warm.cpu_times()\n"
    "        if _times.user + _times.system == _used:\n"
    "            break\n"
    "        _used = _times.user + _times.system\n"
    "        time.sleep(0.5)\n"
    "cpu_before = _own_cpu()",
    1,
)


def _side_by_side(
    trials: int,
    jd: str | None,
    baseline: bool = False,
    no_spare: bool = False,
    warm: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"nbdist": [], "ipyparallel": []}
    if baseline:
        runs[NO_ZYGOTE] = []
    if no_spare:
        runs[NO_SPARE] = []
    if warm:
        runs[WARM] = []
    if jd:
        runs["jupyter-distributed"] = []
    for trial in range(trials):
        order = list(runs)
        if trial % 2:
            order.reverse()
        for side in order:
            if side == "nbdist":
                result = _run(sys.executable, _NBDIST, "2", "1")
            elif side == NO_ZYGOTE:
                result = _run(sys.executable, _NBDIST, "2", "1", zygote=False)
            elif side == NO_SPARE:
                result = _run(sys.executable, _NBDIST_NO_SPARE, "2", "1")
            elif side == WARM:
                result = _run(sys.executable, _NBDIST_WARM, "2", "1")
            elif side == "ipyparallel":
                result = _run(sys.executable, _IPYPARALLEL)
            else:
                assert jd is not None
                result = _run(jd, _JUPYTER_DISTRIBUTED)
            runs[side].append(result)
            print(
                f"  trial {trial + 1}/{trials} {side:<20} ready {result['ready']:6.2f} s  "
                f"first cell {result['first_cell']:6.2f} s  (load {result['load']:.1f})",
                flush=True,
            )
    return runs


def _summary(runs: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    rows = []
    for side, results in runs.items():
        rows.append(
            [
                side,
                f"{median([r['ready'] for r in results]):.2f} s",
                f"{median([r['first_cell'] for r in results]):.2f} s",
                f"{median([r['load'] for r in results]):.1f}",
                len(results),
            ]
        )
    return rows


def _stage_table(results: list[dict[str, Any]]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    names: list[str] = []
    for result in results:
        for stage in result["report"]["stages"]:
            if stage["name"] not in names:
                names.append(stage["name"])
    rows, data = [], []
    for name in names:
        took = [s["seconds"] for r in results for s in r["report"]["stages"] if s["name"] == name]
        at = [s["at"] for r in results for s in r["report"]["stages"] if s["name"] == name]
        rows.append([name, f"{median(took):.2f} s", f"{median(at):.2f} s"])
        data.append({"stage": name, "seconds": median(took), "at": median(at), "n": len(took)})
    total = median([r["report"]["total"] for r in results])
    rows.append(["total (from the %dist start line)", "", f"{total:.2f} s"])
    return rows, data


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__ or "")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 trials, curve 1 and 2")
    parser.add_argument("--curve", default="1,2,4,8", help="engine counts of the curve")
    parser.add_argument("--curve-trials", type=int, default=1)
    parser.add_argument("--loaded", action="store_true", help="also with a busy loop per core")
    parser.add_argument("--jd-python", default=None, help="a Python with jupyter-distributed")
    parser.add_argument("--no-jd", action="store_true", help="leave jupyter-distributed out")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="leave out the runs with NBDIST_ZYGOTE=0 (every engine a Python of its own)",
    )
    parser.add_argument(
        "--no-spare-too",
        action="store_true",
        help="also a side whose zygote starts after the notebook's imports, not before them",
    )
    parser.add_argument(
        "--warm-too",
        action="store_true",
        help="also a side that starts from a warm zygote (`%%dist warm on` earlier)",
    )
    args = parser.parse_args(argv)
    trials = 2 if args.quick else args.trials
    curve = [1, 2] if args.quick else [int(n) for n in args.curve.split(",")]
    env = environment()
    print(f"bench_startup: {env['cpu_count']} cores, load {env['loadavg_at_start']}", flush=True)
    jd, jd_note = (None, "left out (--no-jd)") if args.no_jd else _jd_python(args.jd_python)
    print(f"jupyter-distributed: {jd_note}", flush=True)

    print("\n1. side by side (fresh process each, to a first trivial cell done)", flush=True)
    baseline = not args.no_baseline
    runs = _side_by_side(trials, jd, baseline, args.no_spare_too, args.warm_too)
    headers = ["", "start to ready", "to first cell done", "load (1 min)", "trials"]
    print(table(headers, _summary(runs)))
    nbdist_runs = runs["nbdist"]
    for side in [side for side in ("nbdist", NO_ZYGOTE, NO_SPARE, WARM) if side in runs]:
        print(
            f"{side}: %load_ext {median([r['load_ext'] for r in runs[side]]) * 1e3:.0f} ms; "
            f"%dist start -n 2: {median([r['start'] for r in runs[side]]):.2f} s; cluster "
            f"CPU to start: {median([r['cluster_cpu'] for r in runs[side]]):.2f} s; notebook "
            f"CPU: {median([r['notebook_cpu'] for r in runs[side]]):.2f} s"
        )
    memory = [r["zygote_memory"] for r in nbdist_runs if r.get("zygote_memory")]
    engine_uss = [m for r in nbdist_runs for m in r.get("engine_uss_mb", [])]
    if memory:
        print(
            f"engine zygote memory: RSS {median([m['rss_mb'] for m in memory]):.0f} MiB, USS "
            f"{median([m['uss_mb'] for m in memory]):.0f} MiB; a forked engine's USS "
            f"{median(engine_uss):.0f} MiB"
        )

    print("\n2. nbdist's start, stage by stage (medians)")
    stage_rows, stages = _stage_table(nbdist_runs)
    print(table(["stage", "took", "at"], stage_rows))
    if WARM in runs:
        print(f"\n   the same with {WARM} (the zygote's imports done before)")
        print(table(["stage", "took", "at"], _stage_table(runs[WARM])[0]))
    baseline_stages = None
    if baseline:
        print(f"\n   the same with {NO_ZYGOTE} (every engine imports torch itself)")
        baseline_rows, baseline_stages = _stage_table(runs[NO_ZYGOTE])
        print(table(["stage", "took", "at"], baseline_rows))

    print("\n3. the curve: %dist start -n N, then a trivial %%distribute cell", flush=True)
    points, baseline_points = [], []
    for n in curve:
        for zygote in (True, False) if baseline else (True,):
            results = [
                _run(sys.executable, _NBDIST, str(n), "5", zygote=zygote)
                for _ in range(args.curve_trials)
            ]
            point = {
                "engines": n,
                "start": median([r["start"] for r in results]),
                "cell": median([r["cell"] for r in results]),
                "cluster_cpu": median([r["cluster_cpu"] for r in results]),
                "notebook_cpu": median([r["notebook_cpu"] for r in results]),
                "load": median([r["load"] for r in results]),
                "trials": len(results),
            }
            (points if zygote else baseline_points).append(point)
            print(
                f"  {n} engine(s){'' if zygote else f' ({NO_ZYGOTE})'}: start "
                f"{point['start']:.2f} s, cell {point['cell'] * 1e3:.0f} ms, cluster CPU "
                f"{point['cluster_cpu']:.2f} s, notebook CPU {point['notebook_cpu']:.2f} s "
                f"(load {point['load']:.1f})",
                flush=True,
            )
    two = next((p for p in points if p["engines"] == 2), None)
    eight = next((p for p in points if p["engines"] == 8), None)
    growth = eight["start"] / two["start"] if two and eight else None
    if growth is not None:
        print(f"8 engines / 2 engines start time: {growth:.2f}x (target <= 2x)")

    loaded = None
    if args.loaded:
        print("\n4. the same side by side with a busy loop on each core", flush=True)
        with _busy_cores():
            loaded = _side_by_side(max(2, trials // 2), jd, baseline)
        print(table(headers, _summary(loaded)))

    print("\n5. checks (a regression of 2026-11-24 doubled the start: guarded here)")
    guard = _run(sys.executable, _GUARD)
    checks = [
        check("%load_ext nbdist", median([r["load_ext"] for r in nbdist_runs]), "<=", 0.2,
              unit=" s"),
        check(f"%load_ext + %dist start -n 2 (load {median([r['load'] for r in nbdist_runs]):.0f})",
              median([r["ready"] for r in nbdist_runs]), "<=", 1.5, unit=" s",
              note="the issue's target on a quiet 2-core machine"),
        check("CPU of a 2-engine cluster's start", median([r["cluster_cpu"] for r in nbdist_runs]),
              "<=", 7.0, unit=" s", note="9.3-11.7 s with Dynamo and torch imported everywhere"),
        check("the notebook's own CPU for %load_ext + %dist start -n 2",
              median([r["notebook_cpu"] for r in nbdist_runs]), "<=", 1.0, unit=" s",
              note="about 0.4 s; 1.4-1.6 s when the notebook imported torch to start"),
        check("heavy modules the controller imports", float(len(guard["controller"])), "<=", 0,
              unit="", note=f"{guard['controller']}"),
        check("engines import torch._dynamo", float(guard["engine_dynamo"]), "<=", 0, unit=""),
    ]  # fmt: skip
    cpu = {p["engines"]: p["cluster_cpu"] for p in points}
    if 2 in cpu and 8 in cpu:
        checks.append(check("CPU of 8 engines' start / 2 engines'", cpu[8] / cpu[2], "<=", 2.0))
    if baseline:
        checks.append(
            check("CPU of a 2-engine start, zygote / NBDIST_ZYGOTE=0",
                  median([r["cluster_cpu"] for r in nbdist_runs])
                  / median([r["cluster_cpu"] for r in runs[NO_ZYGOTE]]),
                  "<=", 1.0, note="engines forked from one process that imported torch")
        )  # fmt: skip
    print_checks(checks)

    payload = {
        "checks": checks,
        "environment": env,
        "trials": trials,
        "jupyter_distributed": jd_note,
        "side_by_side": {
            side: {
                "ready_median": median([r["ready"] for r in results]),
                "first_cell_median": median([r["first_cell"] for r in results]),
                "load_median": median([r["load"] for r in results]),
                "trials": [
                    {k: v for k, v in r.items() if k not in ("report", "output")} for r in results
                ],
            }
            for side, results in runs.items()
        },
        "nbdist_load_ext_median_s": median([r["load_ext"] for r in nbdist_runs]),
        "nbdist_start_median_s": median([r["start"] for r in nbdist_runs]),
        "stages": stages,
        "stages_without_zygote": baseline_stages,
        "zygote_memory_mb": memory[-1] if memory else None,
        "forked_engine_uss_mb": median(engine_uss) if engine_uss else None,
        "curve": points,
        "curve_without_zygote": baseline_points,
        "curve_8_over_2": growth,
        "loaded": (
            None
            if loaded is None
            else {
                side: {
                    "ready_median": median([r["ready"] for r in results]),
                    "first_cell_median": median([r["first_cell"] for r in results]),
                    "load_median": median([r["load"] for r in results]),
                }
                for side, results in loaded.items()
            }
        ),
        "example_output": nbdist_runs[-1]["output"],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = write_result("bench_startup", payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
