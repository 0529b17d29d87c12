"""Engines (nd.Cluster): %%distribute, run, run_steps, start-up vs ipyparallel and nbdistributed.

Two CPU engines. Every nbdist measure has an anchor taken in the same run, interleaved with it
(the order alternates from trial to trial):

1. a trivial `%%distribute` cell (`1 + 1`) vs ipyparallel's `%%px` on the same engines (the
   cluster's own `ipyparallel.Client`, a `DirectView` in rank order, `view.activate()`), both
   driven through an in-process IPython shell, their printed output captured;
2. `cluster.strategy.run(fn)` vs `view.apply_sync(fn)` of the same trivial function;
3. one step of `cluster.strategy.run_steps(fn, "it", steps=100)` (its time / 100) vs one
   `cluster.strategy.run(fn)` round trip;
4. `nd.Cluster(n=2).start()` to ready vs a bare `ipyparallel.Cluster(n=2)`
   `.start_and_connect_sync()` + `wait_for_engines(2)`, alternating, each stopped after. An
   informational second anchor uses ipyparallel with nbdist's launch settings (`delay=0`, 1 s
   heartbeat, controller on 127.0.0.1);
5. the same trivial `%%distribute` cell vs the third-party `nbdistributed` package's
   `%%distributed` (PyPI 0.1.0, `benchmarks/requirements.txt`) on 2 CPU workers of its own
   (`%load_ext nbdistributed`, `%dist_init -n 2`, `%dist_mode --disable`), in the same shell.

The nbdistributed phase runs after 1-3, with nbdist's engines still up: both clusters coexist
(4 processes on 2 cores, but idle ones block in a socket receive, so only the side being timed
works) and the two cells alternate trial by trial. It is a phase of its own, not a third variant
of 1, because nbdistributed keeps a thread in this process that wakes every 100 ms; 1-3 run
without it. nbdistributed starts its workers as `python .../nbdistributed/worker.py` (the first
`python` on PATH), so this interpreter's directory is put first on PATH while they start. Its
shutdown: `%dist_shutdown` and `%unload_ext` of 0.1.0 stop class-level managers that
`%dist_init` never sets (it stores them on the magic instance), so both leave the workers
running, and `%dist_reset` runs `pkill -f` on broad patterns (`worker.py`, `python.*worker`,
...) that would hit other processes on a shared machine; so the benchmark runs the steps of its
`DistributedMagic.shutdown_all` on the instance's managers (the "shutdown" message, the
communication manager's `shutdown()`, the process manager's `shutdown()`: SIGTERM then SIGKILL,
by pid). Without nbdistributed installed, 5 is skipped (reported, not a crash).

Every process started here is stopped in `finally` blocks, and the run ends by checking with
psutil that no ipengine / ipcontroller / nbdistributed worker process it started is left.

Run: `python benchmarks/bench_engines.py [--quick]` (~60-90 s on 2 cores, nbdistributed's phase,
~15 s, included).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import logging
import os
import sys
import tempfile
import time
from typing import Any

# A private IPython profile directory, before IPython / ipyparallel read it.
_IPYTHONDIR = tempfile.mkdtemp(prefix="nbdist-bench-ipython-")
os.environ["IPYTHONDIR"] = _IPYTHONDIR

import psutil  # noqa: E402
from _common import (  # noqa: E402
    benchmark_parser,
    check,
    finish,
    median,
    paired_ratios,
    parse_in_process_args,
    ratio_table,
    round_robin,
    summarize,
    summary_row,
    table,
)

import nbdist as nd  # noqa: E402

NAME = "engines"
STEPS = 100
_IPP_WORDS = ("ipengine", "ipcontroller", "ipyparallel.engine", "ipyparallel.controller",
              "ipyparallel.cluster")  # fmt: skip
_NBD_WORDS = (os.path.join("nbdistributed", "worker.py"),)  # its workers' command line
NBD_MISSING = (
    "nbdistributed not installed: pip install -c constraints/dev.txt -r benchmarks/requirements.txt"
)


def trivial() -> int:
    """The function every round trip runs (defined in `__main__`, as in a notebook)."""
    return 1


def step(batch: Any) -> Any:
    """One trivial step of run_steps: returns its batch."""
    return batch


# -- processes ---------------------------------------------------------------------------------
_seen: set[int] = set()


def _note_children() -> None:
    """Remember every descendant process of this one (to check they are gone at the end)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            _seen.add(child.pid)


def _ipp_processes(words: tuple[str, ...] = _IPP_WORDS) -> list[psutil.Process]:
    """Live processes this run started (seen as children, or naming our IPYTHONDIR) whose
    command line has one of `words` (by default: ipyparallel's)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            ours = proc.info["pid"] in _seen or _IPYTHONDIR in cmd
            match = any(word in cmd for word in words)
            if ours and match and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_leftovers(grace: float = 5.0) -> list[str]:
    """Give the processes this run started `grace` s to exit, then kill (by pid) what is left.

    Returns `"pid cmdline"` of each process that had to be killed.
    """
    left = _ipp_processes(_IPP_WORDS + _NBD_WORDS)
    _, left = psutil.wait_procs(left, timeout=grace)
    killed = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            killed.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
            proc.kill()
    psutil.wait_procs(left, timeout=5)
    return killed


# -- 1-3: latency on one cluster ---------------------------------------------------------------
def latency(args: Any) -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    from nbdist.magics import current_cluster

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdist")
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink):
            shell.run_line_magic("dist", "start -n 2 --timeout 90")
        cluster = current_cluster()
        assert cluster is not None and cluster.running
        _note_children()
        ids = [engine.id for engine in cluster.engines]  # rank order
        view = cluster.client.direct_view(ids)
        view.block = True
        # ipyparallel 9 is no IPython extension (`%load_ext ipyparallel` only prints so):
        # `view.activate()` registers %px / %%px bound to this view.
        view.activate()

        def quiet(fn):
            def call() -> Any:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    out = fn()
                sink.seek(0)
                sink.truncate()
                return out

            return call

        distribute = quiet(lambda: shell.run_cell_magic("distribute", "", "1 + 1"))
        px = quiet(lambda: shell.run_cell_magic("px", "", "1 + 1"))
        assert list(distribute().values) == [2, 2], "%%distribute did not return [2, 2]"
        run = lambda: cluster.strategy.run(trivial)  # noqa: E731
        apply = lambda: view.apply_sync(trivial)  # noqa: E731
        assert list(run().values) == [1, 1] and apply() == [1, 1]
        with contextlib.redirect_stdout(sink):
            shell.run_cell_magic(
                "distribute", "--output none", "import itertools\nit = itertools.count()"
            )
        steps = lambda: cluster.strategy.run_steps(step, "it", steps=STEPS)  # noqa: E731
        first = list(steps().values)
        assert first[0] == first[1] == STEPS - 1, first

        def one(fn) -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        cells = round_robin(
            {"%%distribute": distribute, "%%px": px}, trials=args.trials, warmup=5, time_one=one
        )
        calls = round_robin(
            {"strategy.run": run, "apply_sync": apply},
            trials=args.trials, warmup=5, time_one=one,
        )  # fmt: skip
        per_step = round_robin(
            {"run_steps (per step)": steps, "strategy.run": run},
            trials=args.step_trials, warmup=2, time_one=one,
        )  # fmt: skip
        per_step["run_steps (per step)"] = [t / STEPS for t in per_step["run_steps (per step)"]]
        groups = {"cells": cells, "calls": calls, "steps": per_step}
        nbd = against_nbdistributed(shell, distribute, quiet, args.trials)
        if nbd is not None:
            groups["cells vs nbdistributed"] = nbd
        return groups
    finally:
        _note_children()
        with contextlib.redirect_stdout(sink), contextlib.suppress(Exception):
            shell.run_line_magic("dist", "stop")
        with contextlib.suppress(Exception):
            shell.run_line_magic("unload_ext", "nbdist")


# -- 5: nbdistributed's %%distributed (from `latency`, its cluster still up) -----------------
NBD_CELL = "%%distributed (nbdistributed)"
_nbd_info: dict[str, Any] = {}  # what the phase learnt (version, start time), for the JSON


@contextlib.contextmanager
def _this_python_first() -> Any:
    """Put this interpreter's directory first on PATH (nbdistributed runs `python worker.py`)."""
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


def _nbd_stop(shell: Any, magic: Any) -> None:
    """nbdistributed's graceful shutdown (`DistributedMagic.shutdown_all`'s steps) applied to the
    managers `%dist_init` stored on `magic`, then its hooks removed and the extension unloaded."""
    comm, manager = magic._comm_manager, magic._process_manager
    magic._comm_manager = magic._process_manager = None
    magic._num_processes = 0
    try:
        if comm is not None:
            # The worker leaves its loop on "shutdown" without answering: this always times out.
            with contextlib.suppress(Exception):
                comm.send_to_all("shutdown", {}, timeout=2.0)
            with contextlib.suppress(Exception):
                comm.shutdown()
        if manager is not None:
            _seen.update(process.pid for process in manager.processes)
            manager.shutdown()  # SIGTERM, up to 3 s, then SIGKILL, by pid
    finally:
        magic._disable_distributed_mode()
        for event, hook in (("pre_run_cell", magic._pre_execution_timeline),
                            ("post_run_cell", magic._post_execution_sync)):  # fmt: skip
            with contextlib.suppress(ValueError):
                shell.events.unregister(event, hook)
        with contextlib.suppress(Exception):
            shell.run_line_magic("unload_ext", "nbdistributed")


def against_nbdistributed(
    shell: Any, distribute: Any, quiet: Any, trials: int
) -> dict[str, list[float]] | None:
    """`%%distribute` vs nbdistributed's `%%distributed` (`1 + 1`, 2 CPU workers), interleaved.

    None (and a printed line) when nbdistributed is not installed.
    """
    if importlib.util.find_spec("nbdistributed") is None:
        print(NBD_MISSING, flush=True)
        _nbd_info["skipped"] = NBD_MISSING
        return None
    _nbd_info["version"] = importlib.metadata.version("nbdistributed")
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        shell.run_line_magic("load_ext", "nbdistributed")
    magic = shell.magics_manager.registry["DistributedMagic"]
    try:
        begin = time.perf_counter()
        with contextlib.redirect_stdout(sink), _this_python_first():
            shell.run_line_magic("dist_init", "-n 2")
        comm, manager = magic._comm_manager, magic._process_manager
        if manager is not None:
            _seen.update(process.pid for process in manager.processes)
        if comm is None:
            raise RuntimeError(f"nbdistributed's %dist_init failed:\n{sink.getvalue()}")
        # %dist_init returns after a fixed 2 s sleep, before the workers have joined their process
        # group and connected (a message to a worker not connected yet is dropped): wait until
        # both answer.
        deadline = time.monotonic() + 90
        while True:
            try:
                comm.send_to_all("get_status", {}, timeout=1.0)
                break
            except TimeoutError:
                dead = [p.pid for p in manager.processes if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    message = f"nbdistributed workers not ready (exited: {dead})"
                    raise RuntimeError(message) from None
        _nbd_info["start_to_ready_s"] = time.perf_counter() - begin
        _note_children()
        with contextlib.redirect_stdout(sink):
            shell.run_line_magic("dist_mode", "--disable")  # plain cells stay local
        sink.seek(0)
        sink.truncate()
        with contextlib.redirect_stdout(sink):
            shell.run_cell_magic("distributed", "", "1 + 1")
        printed = sink.getvalue()
        assert "Rank 0:\n  2" in printed and "Rank 1:\n  2" in printed, printed
        distributed = quiet(lambda: shell.run_cell_magic("distributed", "", "1 + 1"))

        def one(fn) -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        return round_robin(
            {"%%distribute": distribute, NBD_CELL: distributed},
            trials=trials, warmup=5, time_one=one,
        )  # fmt: skip
    finally:
        _note_children()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            _nbd_stop(shell, magic)


# -- 4: start-up -------------------------------------------------------------------------------
def start_nbdist() -> float:
    cluster = nd.Cluster(n=2, timeout=90)
    try:
        begin = time.perf_counter()
        cluster.start()
        elapsed = time.perf_counter() - begin
        _note_children()
        assert list(cluster.strategy.run(trivial).values) == [1, 1]
        return elapsed
    finally:
        _note_children()
        cluster.stop()


def start_ipp(tuned: bool) -> float:
    import ipyparallel

    kwargs: dict[str, Any] = {"n": 2, "log_level": logging.WARNING}
    if tuned:  # nbdist's launch settings, without torch and the process group
        kwargs.update(
            controller_ip="127.0.0.1", delay=0.0,
            controller_args=["--HeartMonitor.period=1000"],
        )  # fmt: skip
    ipp = ipyparallel.Cluster(**kwargs)
    client = None
    try:
        begin = time.perf_counter()
        client = ipp.start_and_connect_sync()
        client.wait_for_engines(2, timeout=90, block=True, interactive=False)
        elapsed = time.perf_counter() - begin
        _note_children()
        assert client[:].apply_sync(trivial) == [1, 1]
        return elapsed
    finally:
        _note_children()
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        with contextlib.suppress(Exception):
            ipp.stop_cluster_sync()


def startup(reps: int) -> dict[str, list[float]]:
    variants = {
        "nd.Cluster(n=2).start()": start_nbdist,
        "ipyparallel.Cluster(n=2) (defaults)": lambda: start_ipp(False),
        "ipyparallel.Cluster(n=2) (nbdist's settings)": lambda: start_ipp(True),
    }
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            samples[name].append(variants[name]())
    return samples


# -- main --------------------------------------------------------------------------------------
def _ratios(samples: dict[str, list[float]], num: str, den: str) -> tuple[float, float]:
    of_medians = median(samples[num]) / median(samples[den])
    return of_medians, median(paired_ratios(samples[num], samples[den]))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--trials", type=int, default=60, help="round trips per variant")
    parser.add_argument("--step-trials", type=int, default=20, help="run_steps calls")
    parser.add_argument("--start-reps", type=int, default=2, help="starts per variant")
    args, env = parse_in_process_args(
        parser, argv, quick={"trials": 10, "step_trials": 4, "start_reps": 1}
    )
    print(f"== engines: 2 CPU engines; load {env['loadavg_at_start']}", flush=True)
    began = time.perf_counter()
    leftovers: list[str] = []
    try:
        lat = latency(args)
        starts = startup(args.start_reps)
    finally:
        leftovers = _kill_leftovers()
    remaining = _ipp_processes()
    remaining_nbd = _ipp_processes(_NBD_WORDS)
    print(f"(measured in {time.perf_counter() - began:.1f} s)")

    groups = {**lat, "start": starts}
    for title, samples in groups.items():
        print(f"\n-- {title}")
        print(
            table(
                ["variant", "median", "IQR", "min"],
                [summary_row(name, summarize(values)) for name, values in samples.items()],
            )
        )
    pairs = [
        ("%%distribute / %%px", "cells", "%%distribute", "%%px", "<=", 1.2),
        ("strategy.run / apply_sync", "calls", "strategy.run", "apply_sync", "<=", 1.5),
        ("run_steps per step / strategy.run", "steps", "run_steps (per step)", "strategy.run",
         "<=", 1 / 20),
        ("Cluster start / ipyparallel start", "start", "nd.Cluster(n=2).start()",
         "ipyparallel.Cluster(n=2) (defaults)", "<=", 0.8),
    ]  # fmt: skip
    nbd_metric = "%%distribute / nbdistributed %%distributed"
    skipped = []
    if "cells vs nbdistributed" in groups:
        pairs.insert(1, (nbd_metric, "cells vs nbdistributed", "%%distribute", NBD_CELL, "<", 1))
    else:
        skipped.append({"metric": nbd_metric, "reason": _nbd_info.get("skipped", "not measured")})
    info = ("Cluster start / ipyparallel start (nbdist's settings)", "start",
            "nd.Cluster(n=2).start()", "ipyparallel.Cluster(n=2) (nbdist's settings)")  # fmt: skip
    rows, checks = [], []
    for metric, group, num, den, op, threshold in pairs:
        a, b = _ratios(groups[group], num, den)
        rows.append([metric, a, b])
        checks.append(check(metric, a, op, threshold, cross_check=b))
    a, b = _ratios(groups[info[1]], info[2], info[3])
    rows.append([info[0] + " (info)", a, b])
    print()
    print(ratio_table(rows))
    for row in skipped:
        print(f"{row['metric']}: skipped ({row['reason']})")
    if "start_to_ready_s" in _nbd_info:
        print(
            f"nbdistributed {_nbd_info['version']}: %dist_init -n 2 to both workers answering "
            f"in {_nbd_info['start_to_ready_s']:.2f} s (one start, for information)"
        )
    print()
    clean = not remaining
    print(
        f"processes: {len(leftovers)} process(es) of the run had to be killed at the end; "
        f"{len(remaining)} ipyparallel process(es) left now ({'clean' if clean else 'NOT clean'})"
    )
    for line in leftovers:
        print(f"  killed: {line}")
    if "version" in _nbd_info:
        print(
            f"nbdistributed workers left now: {len(remaining_nbd)} "
            f"({'clean' if not remaining_nbd else 'NOT clean'})"
        )
    checks.append(check("ipyparallel processes left", float(len(remaining)), "<=", 0, unit=""))
    if "version" in _nbd_info:
        checks.append(
            check("nbdistributed workers left", float(len(remaining_nbd)), "<=", 0, unit="")
        )
    return finish(
        NAME,
        checks,
        {
            "environment": env,
            "parameters": {
                "engines": 2,
                "trials": args.trials,
                "step_trials": args.step_trials,
                "steps": STEPS,
                "start_reps": args.start_reps,
                "quick": args.quick,
            },
            "statistics": {
                group: {name: summarize(values) for name, values in samples.items()}
                for group, samples in groups.items()
            },
            "samples": groups,
            "informational": {info[0]: {"ratio_of_medians": a, "paired_median": b}},
            "nbdistributed": _nbd_info,
            "skipped": skipped,
            "killed_at_end": leftovers,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
