"""A real Slurm on the namespace hosts: srun, `SlurmClusterResolver`, and the slurm launcher.

`nbdist.testing.slurm` runs Debian's munged and slurmctld on `nb` and a slurmd on each of h1
and h2 (2 CPUs each, partition `debug`). A real kernel on `nb` (with `SLURM_CONF`) runs
`%dist start --launcher slurm -n 4`: one real `sbatch` job whose `srun` step starts the engines
on the allocated nodes. The tests share the cluster and run in order: srun across the hosts,
the resolver inside a real step, start, training, stop (the job ends), then jobs Slurm refuses
or will never run.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster
from nbdist.testing.slurm import SlurmCluster, skip_reason, slurm_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

START_S = 240.0
STOPPED_WITHIN_S = 10.0
"""After `%dist stop` (which returns once scancel has): the job is gone and so are the engines
(0.8 s here)."""
REFUSED_WITHIN_S = 30.0
"""A refused or never-running job is named well within the start timeout (START_S)."""


@pytest.fixture(scope="module")
def slurm(hosts: HostCluster) -> Iterator[SlurmCluster]:
    reason = skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm is required in CI: {reason}")
        pytest.skip(reason)
    with slurm_cluster(hosts) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kernel(hosts: HostCluster, slurm: SlurmCluster, tmp_path_factory) -> Iterator[HostKernel]:
    folder = tmp_path_factory.mktemp("slurm")
    env = {"IPYTHONDIR": str(folder / "ipython"), **slurm.env}
    with HostKernel(hosts, env=env) as k:
        k.execute("%load_ext nbdist")
        # ipyparallel writes the batch script into the working folder
        k.execute(f"import os; os.chdir({str(folder)!r})")
        k.folder = folder  # type: ignore[attr-defined]
        k.execute("import torch, nbdist as nd\nfrom nbdist.magics.core import current_cluster")
        try:
            yield k
        finally:
            k.execute("%dist stop", timeout=120, allow_error=True)


def wait_until_no_jobs(slurm: SlurmCluster, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while slurm.jobs():
        assert time.monotonic() < deadline, f"jobs left in Slurm: {slurm.jobs()}"
        time.sleep(0.2)  # polling squeue (bounded by the deadline)


def engine_processes(hosts: HostCluster) -> list[str]:
    """The engines (not the batch script's `srun` that started them) on h1 and h2."""
    found = [p for name in ("h1", "h2") for p in hosts.processes(name) if "_engine_main" in p]
    return [p for p in found if p.split(": ", 1)[1].startswith(sys.executable)]


def test_srun_runs_one_task_on_each_host(slurm: SlurmCluster):
    done = slurm.run(["srun", "-N2", "-n2", "hostname"])
    assert sorted(done.stdout.split()) == ["h1", "h2"], done


def test_slurm_cluster_resolver_inside_a_real_srun_step(slurm: SlurmCluster, tmp_path):
    # each task writes its view to a file (srun's stdout may split long lines)
    code = (
        "import json, os, pathlib\n"
        "from nbdist.cluster_resolver import SlurmClusterResolver\n"
        "r = SlurmClusterResolver(jobs={'ps': 1, 'worker': 3}, gpus_per_node=0)\n"
        "seen = {'spec': r.cluster_spec().as_dict(), 'type': r.task_type,\n"
        "    'id': r.task_id, 'master': r.master(), 'host': os.uname().nodename,\n"
        "    'env': {k: v for k, v in os.environ.items() if k.startswith('SLURM_')}}\n"
        f"pathlib.Path({str(tmp_path)!r}, os.environ['SLURM_PROCID'])"
        ".write_text(json.dumps(seen))\n"
    )
    done = slurm.run(["srun", "-n4", sys.executable, "-c", code], timeout=120)
    seen = [json.loads(path.read_text()) for path in sorted(tmp_path.iterdir())]
    assert len(seen) == 4, done
    env = seen[0]["env"]
    # what Slurm set: 4 tasks, 2 per node on h1 and h2 (2 CPUs each), in block order
    assert env["SLURM_STEP_NUM_TASKS"] == "4" and env["SLURM_STEP_NODELIST"] == "h[1-2]"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    port = 8888
    expected = {
        "ps": [f"h1:{port}"],
        "worker": [f"h1:{port + 1}", f"h2:{port}", f"h2:{port + 1}"],
    }
    by_rank = {int(item["env"]["SLURM_PROCID"]): item for item in seen}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, item in by_rank.items():
        assert item["spec"] == expected, item
        assert item["host"] == ("h1" if rank < 2 else "h2")
        assert (item["type"], item["id"]) == (("ps", 0) if rank == 0 else ("worker", rank - 1))
        assert item["master"] == f"grpc://{'h1' if rank < 2 else 'h2'}:{port + rank % 2}"
        assert item["env"]["SLURM_STEP_NODELIST"] == env["SLURM_STEP_NODELIST"]
    wait_until_no_jobs(slurm)


def test_the_resolver_inside_a_batch_job_and_its_step(slurm: SlurmCluster, tmp_path):
    # a 4-task batch job (2 per node): its batch script sees the job (2(x2)); a step of 1 task
    # per node inside it sees the step (Slurm sets the step's variables there)
    code = (
        "import json, os, pathlib, sys\n"
        "from nbdist.cluster_resolver import SlurmClusterResolver\n"
        "r = SlurmClusterResolver(gpus_per_node=0)\n"
        "seen = {'spec': r.cluster_spec().as_dict(), 'id': r.task_id,\n"
        "    'per_node': os.environ['SLURM_TASKS_PER_NODE']}\n"
        f"pathlib.Path({str(tmp_path)!r}, sys.argv[1] + os.environ['SLURM_PROCID'])"
        ".write_text(json.dumps(seen))\n"
    )
    python = f"{sys.executable} -c {shlex.quote(code)}"
    script = tmp_path.parent / f"{tmp_path.name}-job.sh"
    script.write_text(f"#!/bin/sh\n{python} batch || exit 1\nexec srun -n2 {python} step\n")
    done = slurm.run(["sbatch", "--wait", "-N2", "-n4", f"--output={script}.out", str(script)],
                     timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, (done, Path(f"{script}.out").read_text(errors="replace"))
    seen = {path.name: json.loads(path.read_text()) for path in tmp_path.iterdir()}
    assert sorted(seen) == ["batch0", "step0", "step1"], seen
    four = ["h1:8888", "h1:8889", "h2:8888", "h2:8889"]
    assert seen["batch0"] == {"spec": {"worker": four}, "id": 0, "per_node": "2(x2)"}
    for rank in (0, 1):
        item = seen[f"step{rank}"]
        assert item == {"spec": {"worker": ["h1:8888", "h2:8888"]}, "id": rank,
                        "per_node": "1(x2)"}  # fmt: skip
    wait_until_no_jobs(slurm)


def test_start_submits_a_real_job_with_engines_on_the_nodes(
    hosts: HostCluster, slurm: SlurmCluster, kernel: HostKernel
):
    began = time.monotonic()
    reply = kernel.execute(
        f"%dist start --launcher slurm -n 4 --timeout {START_S:g}", timeout=START_S + 60
    )
    print(f"\n%dist start --launcher slurm -n 4: {time.monotonic() - began:.1f} s")
    jobs = slurm.jobs()
    assert len(jobs) == 1 and " RUNNING nbdist-" in jobs[0], (jobs, reply)
    hosts_of = ast.literal_eval(
        kernel.execute("[row.host for row in current_cluster().status()]")["result"]
    )
    # ranks follow the hosts in the order their engines registered: 2 on each node
    assert hosts_of in (["h1", "h1", "h2", "h2"], ["h2", "h2", "h1", "h1"]), hosts_of
    assert len(engine_processes(hosts)) == 4
    assert [p for p in hosts.processes("nb") if "_engine_main" in p] == []
    # the job's output goes to the profile's log folder, not slurm-JOBID.out in the cwd
    script = kernel.execute("print(open('slurm_engine.sbatch').read())")["stdout"]
    assert "#SBATCH --output=" in script and "/log/" in script, script
    assert not list(kernel.folder.glob("slurm-*.out"))  # type: ignore[attr-defined]


def test_strategy_run_and_training_on_the_allocated_nodes(kernel: HostKernel):
    reply = kernel.execute(
        "def replica_sum():\n"
        "    ctx = nd.get_replica_context()\n"
        "    return ctx.all_reduce('sum', torch.tensor(1.0 + ctx.replica_id_in_sync_group))\n"
        "[float(v) for v in current_cluster().strategy.run(replica_sum).values]"
    )
    assert reply["result"] == "[10.0, 10.0, 10.0, 10.0]"
    reply = kernel.execute(
        "%%distribute\n"
        "import socket, torch.distributed as dist\n"
        "strategy = nd.MultiWorkerMirroredStrategy()\n"
        "with strategy.scope():\n"
        "    torch.manual_seed(0)\n"
        "    model = torch.nn.Linear(3, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def step(x):\n"
        "    opt.zero_grad()\n"
        "    loss = model(x).pow(2).mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    return loss\n"
        "for i in range(3):  # each replica its own data: equal weights need the all-reduce\n"
        "    strategy.run(step, args=(torch.ones(2, 3) * (i + 1 + dist.get_rank()),))\n"
        "print('w', [round(v, 6) for v in model.weight.flatten().tolist()], socket.gethostname())\n"
    )
    lines = [line.split("] ", 1)[-1] for line in reply["stdout"].splitlines() if "] w " in line]
    assert len(lines) == 4, reply["stdout"]
    weights = {line.rsplit(" ", 1)[0] for line in lines}
    assert len(weights) == 1, lines  # every replica holds the same parameters
    assert sorted(line.rsplit(" ", 1)[1] for line in lines) == ["h1", "h1", "h2", "h2"]


def test_stop_ends_the_job_and_leaves_no_engine(
    hosts: HostCluster, slurm: SlurmCluster, kernel: HostKernel
):
    kernel.execute("%dist stop", timeout=120)
    stopped = time.monotonic()
    wait_until_no_jobs(slurm, within=STOPPED_WITHIN_S)
    deadline = stopped + STOPPED_WITHIN_S
    while engine_processes(hosts):
        assert time.monotonic() < deadline, engine_processes(hosts)
        time.sleep(0.2)  # polling for the engines' exits (bounded by the deadline)
    print(f"\njob gone and engines exited {time.monotonic() - stopped:.1f} s after %dist stop")


@pytest.mark.parametrize(
    ("arguments", "slurm_said"),
    [
        ("n=6", "More processors requested than permitted"),
        ("n=2, launcher_options={'options': '--partition=nope'}", "invalid partition specified"),
        ("n=2, launcher_options={'options': '--hold'}", "'JobHeldUser'"),
    ],
    ids=["too-many-engines", "bad-partition", "held-never-runs"],
)
def test_a_job_slurm_will_not_run_is_a_named_error_at_once(
    slurm: SlurmCluster, kernel: HostKernel, arguments: str, slurm_said: str
):
    reply = kernel.execute(
        "import time\n"
        "began = time.monotonic()\n"
        "try:\n"
        f"    nd.Cluster(launcher='slurm', {arguments}, timeout={START_S:g}).start()\n"
        "except Exception as error:\n"
        "    print('took', time.monotonic() - began)\n"
        "    print(type(error).__name__, error)\n",
        timeout=START_S + 60,
    )
    text = reply["stdout"]
    took = float(text.split()[1])
    print(f"\n{arguments}: named after {took:.1f} s:\n{text[-1500:]}")
    assert text.splitlines()[1].startswith("ClusterStartError "), text
    assert slurm_said in text, text
    assert "sinfo" in text and "launcher_options" in text  # the fix is named
    assert "could not stop" not in text + reply["stderr"], reply  # no `scancel ''`
    assert took < REFUSED_WITHIN_S, f"named only after {took:.1f} s (timeout {START_S:g} s)"
    wait_until_no_jobs(slurm)  # the held job was cancelled


def test_dist_start_names_what_slurm_said(slurm: SlurmCluster, kernel: HostKernel):
    reply = kernel.execute(
        f"%dist start --launcher slurm -n 2 --timeout {START_S:g} "
        "--launcher-option options=--partition=nope",
        timeout=START_S + 60,
        allow_error=True,
    )
    text = reply["stdout"] + reply["stderr"] + str(reply["error"])
    assert "Slurm refused the engines' job" in text and "invalid partition specified" in text
    assert kernel.execute("current_cluster() is None", allow_error=True)["error"] is None
    wait_until_no_jobs(slurm)
