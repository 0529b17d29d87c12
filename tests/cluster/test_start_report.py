"""Start-up as the user sees it: each stage said as it happens, an honest total, a report.

Real engines (no timing targets here: timings live in benchmarks/bench_startup.py). The checks
are about consistency: the report's stages are the lines `progress` heard, in order, their
times add up, and the total is the wall time the caller measured around the start (±10 %).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from ipyparallel import interactive

from nbdist.cluster import Cluster
from tests.cluster.conftest import stop_and_check

pytestmark = pytest.mark.cluster


def _check_report(report, lines, n, wall):
    names = [stage.name for stage in report.stages]
    assert [line.split("  ", 1)[1] for line in lines] == names  # said as recorded
    for count in range(1, n + 1):  # every count, none skipped
        assert f"{count}/{n} engines registered" in names
    assert names[0].startswith("imports done")
    assert names[-1] == f"{n} engines joined one torch.distributed group (gloo)"
    ats = [stage.at for stage in report.stages]
    assert ats == sorted(ats)
    assert sum(stage.seconds for stage in report.stages) == pytest.approx(ats[-1])
    assert ats[-1] <= report.total
    assert report.total == pytest.approx(wall, rel=0.10)


@pytest.mark.parametrize("n", [2, 3])
def test_start_says_every_stage_and_the_report_matches_the_wall_time(n, tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cluster = Cluster(n=n, timeout=120.0)
    assert cluster.start_report() is None
    lines: list[str] = []
    try:
        begin = time.perf_counter()
        cluster.start(progress=lines.append)
        wall = time.perf_counter() - begin
        report = cluster.start_report()
        _check_report(report, lines, n, wall)
        assert cluster.start_seconds == report.total
        assert str(report).splitlines()[-1].split()[0] == "total"
        restarted: list[str] = []
        begin = time.perf_counter()
        cluster.restart(progress=restarted.append)  # the stop counts too
        wall = time.perf_counter() - begin
        _check_report(cluster.start_report(), restarted, n, wall)
    finally:
        stop_and_check(cluster)


def test_dist_start_says_starting_before_any_slow_import_and_its_total_is_the_wait(tmp_path):
    """`%load_ext nbdist` and `%dist start -n 2` in one cell, in a fresh interpreter:
    "Starting 2 engine(s)…" is written while torch and ipyparallel are not imported yet, and
    "Started in X s" is the wall time of the cell from its first line (±10 %)."""
    probe = textwrap.dedent(
        """
        import io, json, sys, time
        from IPython.core.interactiveshell import InteractiveShell

        class Recorder(io.StringIO):
            def __init__(self):
                super().__init__()
                self.first_seen = None
            def write(self, text):
                if self.first_seen is None and text.strip():
                    self.first_seen = {
                        "text": text,
                        "imported": [m for m in ("torch", "ipyparallel") if m in sys.modules],
                    }
                return super().write(text)

        shell = InteractiveShell.instance()
        out, real = Recorder(), sys.stdout
        sys.stdout = out
        begin = time.perf_counter()
        try:
            shell.run_cell("%load_ext nbdist\\n%dist start -n 2", store_history=False)
            wall = time.perf_counter() - begin
            torch_after = "torch" in sys.modules  # the group joined, `strategy` ready
            report = shell.user_ns["cluster"].start_report()
        finally:
            sys.stdout = real
            shell.run_line_magic("dist", "stop")
        print(json.dumps({"first": out.first_seen, "output": out.getvalue(), "wall": wall,
                          "total": report.total, "torch_after": torch_after,
                          "stages": [s.name for s in report.stages]}))
        """
    )
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first"] == {"text": "Starting 2 engine(s)…", "imported": []}, seen["output"]
    lines = seen["output"].splitlines()
    started = [line for line in lines if line.startswith("Started in ")]
    assert len(started) == 1, seen["output"]
    printed = float(started[0].split()[2])
    assert printed == pytest.approx(seen["total"], abs=0.05)
    assert seen["total"] == pytest.approx(seen["wall"], rel=0.10)
    for name in seen["stages"]:  # every stage was printed, in order, with its time
        assert any(line.strip().endswith(name) for line in lines), (name, seen["output"])
    assert "1/2 engines registered" in seen["stages"]
    assert seen["torch_after"] is False  # the notebook imports torch at first use, not to start


@interactive
def _sums():
    import torch

    import nbdist as nd

    ctx = nd.get_replica_context()
    r = ctx.replica_id_in_sync_group
    summed = ctx.all_reduce("sum", torch.tensor([1.0, float(r)]))
    return summed, r, ctx.num_replicas_in_sync


@pytest.mark.slow
def test_eight_engines_start_and_all_reduce_on_two_cores(tmp_path, monkeypatch):
    """8 engines (more than the machine's cores: 2 here) start, join one group and
    all-reduce to the same values everywhere; every count 1/8 .. 8/8 is said."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cluster = Cluster(n=8, timeout=300.0)
    lines: list[str] = []
    try:
        begin = time.perf_counter()
        cluster.start(progress=lines.append)
        wall = time.perf_counter() - begin
        _check_report(cluster.start_report(), lines, 8, wall)
        summed, ranks, sizes = cluster.strategy.run(_sums)
        assert ranks.values == tuple(range(8)) and sizes.values == (8,) * 8
        for component in summed.values:  # (8 * 1, 0 + 1 + ... + 7)
            assert component.tolist() == [8.0, 28.0]
        assert [engine.rank for engine in cluster.engines] == list(range(8))
    finally:
        stop_and_check(cluster)
