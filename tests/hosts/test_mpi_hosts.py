"""Engines on two namespace hosts, started by Open MPI over ssh from a real kernel on `nb`.

`nd.Cluster(hosts="h1:2,h2:2", launcher="mpi")` runs `mpiexec --host h1:2,h2:2` on the
notebook's host; Open MPI starts its daemons on h1 and h2 over ssh (`plm_rsh_agent`, with the
cluster's key, passed as `mpi_args`) and they start the engines, which reach `nb` and each
other only through the bridge. The tests share the cluster and run in order: start, the gloo
group's all-reduce, stop (nothing left on any host), then the same through `%dist start
--launcher mpi --hosts h1:2,h2:2` and `%%distribute`.
"""

from __future__ import annotations

import ast
import shutil
import time
from collections.abc import Iterator

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

START_S = 240.0
NANNY_GONE_S = 5.0


@pytest.fixture(scope="module")
def kernel(hosts: HostCluster, tmp_path_factory) -> Iterator[HostKernel]:
    if shutil.which("mpiexec") is None:
        pytest.fail("mpiexec is missing: .ci/run installs openmpi-bin")
    folder = tmp_path_factory.mktemp("mpi")
    with HostKernel(hosts, env={"IPYTHONDIR": str(folder / "ipython")}) as k:
        k.execute("import torch, nbdist as nd")
        try:
            yield k
        finally:
            k.execute("cluster.stop()", timeout=120, allow_error=True)


def engines_on(hosts: HostCluster, name: str) -> list[str]:
    return [p for p in hosts.processes(name) if "_engine_main" in p and "mpiexec" not in p]


def test_mpi_starts_engines_on_both_hosts(hosts: HostCluster, kernel: HostKernel):
    agent = f"ssh -F {hosts.ssh_config}"
    began = time.monotonic()
    kernel.execute(
        f"cluster = nd.Cluster(hosts='h1:2,h2:2', launcher='mpi', timeout={START_S:g},\n"
        f"    launcher_options={{'mpi_args': ['--mca', 'plm_rsh_agent', {agent!r}]}})\n"
        "cluster.start()",
        timeout=START_S + 60,
    )
    print(f"\nmpi start of 4 engines on 2 hosts: {time.monotonic() - began:.1f} s")
    reply = kernel.execute("[row.host for row in cluster.status()]")
    assert ast.literal_eval(reply["result"]) == ["h1", "h1", "h2", "h2"]
    for name in ("h1", "h2"):
        assert len(engines_on(hosts, name)) == 2, hosts.processes(name)
    # mpiexec runs on the notebook's host; the engines do not
    on_nb = hosts.processes("nb")
    assert any("mpiexec" in p for p in on_nb) and not engines_on(hosts, "nb"), on_nb


def test_engines_join_one_gloo_group_across_hosts(kernel: HostKernel):
    reply = kernel.execute(
        "def replica_sum():\n"
        "    ctx = nd.get_replica_context()\n"
        "    return ctx.all_reduce('sum', torch.tensor(1.0 + ctx.replica_id_in_sync_group))\n"
        "[float(v) for v in cluster.strategy.run(replica_sum).values]"
    )
    assert reply["result"] == "[10.0, 10.0, 10.0, 10.0]"
    reply = kernel.execute(
        "def backend_and_host():\n"
        "    import socket, torch.distributed as dist\n"
        "    return f'{dist.get_backend()} {dist.get_world_size()} {socket.gethostname()}'\n"
        "list(cluster.strategy.run(backend_and_host).values)"
    )
    seen = ast.literal_eval(reply["result"])
    assert seen == ["gloo 4 h1"] * 2 + ["gloo 4 h2"] * 2, seen


def test_stop_leaves_nothing_on_any_host(hosts: HostCluster, kernel: HostKernel):
    kernel.execute("cluster.stop()", timeout=120)
    # the engines and Open MPI's daemons are gone when stop() returns; each engine's nanny
    # (its own process) exits once it has seen its engine go, within a second
    deadline = time.monotonic() + NANNY_GONE_S
    while any(hosts.processes(name) for name in ("h1", "h2")):
        assert time.monotonic() < deadline, {n: hosts.processes(n) for n in ("h1", "h2")}
        time.sleep(0.1)  # polling the hosts' processes (bounded by the deadline)
    on_nb = hosts.processes("nb")
    assert len(on_nb) == 2 and all("host_kernel" in p or "ipykernel" in p for p in on_nb), on_nb


def test_dist_start_launcher_mpi_from_the_magic(hosts: HostCluster, kernel: HostKernel):
    agent = f"ssh -F {hosts.ssh_config}"
    kernel.execute("%load_ext nbdist")
    kernel.execute(
        f"%dist start --launcher mpi --hosts h1:2,h2:2 --timeout {START_S:g} "
        f"--launcher-option \"mpi_args=['--mca', 'plm_rsh_agent', '{agent}']\"",
        timeout=START_S + 60,
    )
    try:
        reply = kernel.execute(
            "%%distribute\n"
            "import socket, torch.distributed as dist\n"
            "t = torch.tensor([10.0 * (dist.get_rank() + 1)])\n"
            "dist.all_reduce(t)\n"
            "print('sum', t.item(), socket.gethostname())\n"
        )
        lines = sorted(line for line in reply["stdout"].splitlines() if "sum" in line)
        assert len(lines) == 4 and all("sum 100.0" in line for line in lines), reply["stdout"]
        assert sum(line.endswith("h1") for line in lines) == 2, lines
    finally:
        kernel.execute("%dist stop", timeout=120)
    deadline = time.monotonic() + NANNY_GONE_S
    while any(hosts.processes(name) for name in ("h1", "h2")):
        assert time.monotonic() < deadline, {n: hosts.processes(n) for n in ("h1", "h2")}
        time.sleep(0.1)  # polling the hosts' processes (bounded by the deadline)
