"""Local engines forked from the engine zygote (nbdist/cluster/launch/zygote*.py, _zygote_main).

Real engines, real gloo groups, real process deaths: the engines come from one zygote process
(they are its children, and it runs `_zygote_main`), join one group and all-reduce; they have
not initialised CUDA, have their own pids and their own Python `random` seeds; `stop()`,
`%dist stop` and the death of the process that owns the cluster leave no zygote, engine or
nanny behind; a restart forks fresh engines from the same zygote; an engine that dies before
registering is reported with its output; `NBDIST_ZYGOTE=0` starts engines as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from ipyparallel import interactive

from nbdist.cluster import Cluster, ClusterStartError
from nbdist.testing import assert_processes_gone
from tests.cluster.conftest import stop_and_check

pytestmark = pytest.mark.cluster

GONE_WITHIN_S = 20.0
ZYGOTE = "nbdist.cluster.launch._zygote_main"


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.delenv("NBDIST_ZYGOTE", raising=False)
    return tmp_path


@interactive
def _engine_facts():
    import json
    import os
    import random

    import torch

    import nbdist as nd

    ctx = nd.get_replica_context()
    summed = ctx.all_reduce("sum", torch.tensor([1.0, float(ctx.replica_id_in_sync_group)]))
    return json.dumps(
        {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "cuda_initialized": torch.cuda.is_initialized(),
            "random": random.random(),
            "torch_seed": torch.initial_seed(),
            "sum": summed.tolist(),
        }
    )  # one string per replica (a dict would come back as a dict of PerReplica)


def _per_engine(result) -> list[dict]:
    return [json.loads(text) for text in result.values]


def _zygotes(pids) -> list[int]:
    """The zygotes among `pids` (its forks keep its command line, but not its name)."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if ZYGOTE in " ".join(process.cmdline()) and not process.name().startswith("nbdist-"):
                found.append(pid)
    return found


def test_forked_engines_join_a_group_and_are_separate_processes(ipython_dir):
    cluster = Cluster(n=2, timeout=120.0)
    try:
        cluster.start()
        names = [stage.name for stage in cluster.start_report().stages]
        assert "2 engine(s) forked from the zygote (torch imported once)" in names
        zygotes = _zygotes(cluster.processes)
        assert len(zygotes) == 1, cluster.processes
        facts = _per_engine(cluster.strategy.run(_engine_facts))
        assert [f["ppid"] for f in facts] == zygotes * 2  # forked by the zygote
        assert len({f["pid"] for f in facts}) == 2
        assert {f["pid"] for f in facts} == {e.pid for e in cluster.engines}
        assert all(f["sum"] == [2.0, 1.0] for f in facts)  # (1 + 1, 0 + 1)
        assert not any(f["cuda_initialized"] for f in facts)
        # reseeded after the fork, as fresh processes are (each draws its seeds from the OS)
        assert facts[0]["random"] != facts[1]["random"]
        assert facts[0]["torch_seed"] != facts[1]["torch_seed"]
        assert [psutil.Process(f["pid"]).name() for f in facts] == ["nbdist-engine"] * 2
        nannies = [child.name() for f in facts for child in psutil.Process(f["pid"]).children()]
        assert nannies == ["nbdist-nanny"] * 2, "each engine's nanny is a fork of the engine"

        old = set(cluster.processes)
        cluster.restart()
        assert _zygotes(cluster.processes) == zygotes  # the same zygote, imports kept
        facts = _per_engine(cluster.strategy.run(_engine_facts))
        assert all(f["sum"] == [2.0, 1.0] for f in facts)
        assert not {f["pid"] for f in facts} & old  # fresh engines
        assert_processes_gone(tuple(old - set(cluster.processes)), GONE_WITHIN_S)
    finally:
        pids = cluster.processes if cluster.running else ()
        stop_and_check(cluster)
    assert pids and zygotes[0] in pids
    assert_processes_gone(tuple(pids), GONE_WITHIN_S)


def test_an_engine_that_dies_before_registering_is_reported_with_its_output(ipython_dir):
    crash = ["--IPEngine.url_file=/nonexistent/nbdist-zygote-test.json",
             "--IPEngine.wait_for_url_file=0.1"]  # fmt: skip
    cluster = Cluster(n=2, timeout=60, launcher_options={"engine_args": crash})
    lines: list[str] = []
    with pytest.raises(ClusterStartError) as info:
        cluster.start(progress=lines.append)
    assert any("engine(s) forked from the zygote" in line for line in lines), lines
    message = str(info.value)
    assert "exited before registering" in message
    assert "connection file never arrived" in message  # the engine's own output
    assert not cluster.running and cluster.processes == ()


def test_engines_start_as_their_own_pythons_with_the_zygote_off(ipython_dir, monkeypatch):
    monkeypatch.setenv("NBDIST_ZYGOTE", "0")
    cluster = Cluster(n=2, timeout=120.0)
    try:
        cluster.start()
        assert _zygotes(cluster.processes) == []
        facts = _per_engine(cluster.strategy.run(_engine_facts))
        assert all(f["sum"] == [2.0, 1.0] for f in facts)
        assert {f["ppid"] for f in facts} == {os.getpid()}
    finally:
        stop_and_check(cluster)


OWNER = """
import json, sys
from nbdist.cluster import Cluster

cluster = Cluster(n=2, timeout=90.0).start()
print(json.dumps(cluster.processes), flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_owner_dying_leaves_no_zygote_or_engine(sig, ipython_dir):
    starter = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        line = starter.stdout.readline()  # bounded: the cluster's start timeout (90 s)
        pids = json.loads(line) if line.strip() else []
        assert len(_zygotes(pids)) == 1, f"no zygote among the cluster's processes: {line!r}"
        starter.send_signal(sig)
        starter.wait(timeout=30)
        assert_processes_gone(tuple(pids), GONE_WITHIN_S)
    finally:
        with contextlib.suppress(Exception):
            starter.kill()
            starter.wait(timeout=10)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


MAGICS = """
import json
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.run_cell("%load_ext nbdist\\n%dist start -n 2", store_history=False)
cluster = shell.user_ns["cluster"]
first = cluster.processes
shell.run_line_magic("dist", "restart")
second = cluster.processes
shell.run_line_magic("dist", "stop")
# checked here, before this process exits (its exit would stop a zygote left behind too)
from nbdist.testing import assert_processes_gone
assert_processes_gone(tuple(set(first) | set(second)), 20.0)
print(json.dumps({"first": first, "second": second}))
"""


def test_dist_start_restart_stop_leave_no_process(ipython_dir):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MAGICS)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "engine zygote taken (launched before this start: its imports overlap)" in done.stdout
    assert "engine zygote kept from the last start" in done.stdout
    assert set(seen["first"]) & set(seen["second"]), "the restart kept the zygote"


WARM = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
from nbdist.testing import assert_processes_gone
from nbdist.cluster.launch import zygote

def say(**values):
    print(json.dumps(values), flush=True)

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "nbdist")
shell.run_line_magic("dist", "warm on")
first = zygote.warm_zygote().pid
first_controller = zygote.spare_controller().pid
shell.run_line_magic("dist", "start -n 2")
cluster = shell.user_ns["cluster"]
pids = cluster.processes
controller = cluster._ipp.controller.process.pid
shell.run_line_magic("dist", "stop")
assert_processes_gone(tuple(set(pids) - {first}), 20.0)  # all but the warm zygote
kept = zygote.warm_zygote().pid
kept_controller = zygote.spare_controller().pid
shell.run_line_magic("dist", "warm")
shell.run_line_magic("dist", "warm off")
assert_processes_gone((first, kept_controller), 20.0)
shell.run_line_magic("dist", "warm")
from IPython.core.error import UsageError
try:
    shell.run_line_magic("dist", "warm maybe")
except UsageError as error:
    print("refused:", error)
shell.run_line_magic("dist", "warm on")
second = zygote.warm_zygote().pid
second_controller = zygote.spare_controller().pid
say(first=first, pids=pids, kept=kept, second=second, first_controller=first_controller,
    controller=controller, kept_controller=kept_controller, second_controller=second_controller)
sys.stdin.read()  # until the test kills this process
"""


def test_a_warm_zygote_serves_the_next_start_and_never_outlives_its_owner(ipython_dir):
    """`%dist warm on`: the next `%dist start` takes the waiting zygote, `%dist stop` hands it
    back (every other process gone), `%dist warm off` stops it, and a killed owner leaves none.
    """
    owner = subprocess.Popen(
        [sys.executable, "-c", WARM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: dict = {}
    try:
        lines = []
        for line in owner.stdout:  # bounded: the start's own timeout (120 s)
            lines.append(line)
            if line.startswith("{"):
                seen = json.loads(line)
                break
        output = "".join(lines)
        assert seen, output + owner.stderr.read() if owner.poll() is not None else output
        assert "engine zygote taken (launched before this start" in output
        assert "spare controller took over (its imports done while warm)" in output
        assert seen["first"] in seen["pids"]  # the cluster's engines came from the warm one
        assert seen["controller"] == seen["first_controller"]  # the spare became its controller
        assert seen["controller"] in seen["pids"]  # and was stopped with the cluster
        assert seen["kept"] == seen["first"]
        assert seen["kept_controller"] not in (seen["first_controller"], None)  # a new spare
        assert (
            f"An engine zygote is kept warm (pid {seen['first']}, " in output
            and f"and a spare controller (pid {seen['kept_controller']}, " in output
        ), output
        assert "MiB)" in output
        assert "No engine zygote is kept warm (`%dist warm on` keeps one ready)." in output
        assert "refused: %dist warm takes `on`, `off` or nothing" in output
        assert seen["second"] != seen["first"] and psutil.pid_exists(seen["second"])
        assert psutil.pid_exists(seen["second_controller"])
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        assert_processes_gone((seen["second"], seen["second_controller"]), GONE_WITHIN_S)
    finally:
        with contextlib.suppress(Exception):
            owner.kill()
            owner.wait(timeout=10)
        for pid in [*seen.get("pids", []), seen.get("second"), seen.get("second_controller")]:
            with contextlib.suppress(psutil.Error, TypeError, ValueError):
                psutil.Process(pid).kill()
