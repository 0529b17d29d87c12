"""`nd.Cluster` through ipyparallel's MPI and SSH launchers, with real `mpiexec` and `sshd`.

- MPI: Debian's Open MPI (`openmpi-bin`, installed by `.ci/run`) and mpi4py start 2 engines
  with `mpiexec`; they join one gloo group and all-reduce.
- SSH: the test starts its own `sshd` (`openssh-server`) on 127.0.0.1 and a free port, with a
  host key and a client key made for it, and stops it at the end. Engines on `127.0.0.1:2`
  are started over ssh by ipyparallel's `SSHEngineSetLauncher`.
- Bad hosts fail with a clear error within the timeout: a port where no sshd listens, a
  name that does not resolve, a host whose Python has no nbdist.

Outside CI, a machine without `mpiexec` or `sshd` skips those tests; under CI (`CI` set) they
fail instead, since `.ci/run` installs both.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import Cluster, ClusterStartError
from nbdist.cluster.launch.launchers import ROUTE_TO_HOSTS, for_start, ipyparallel_settings
from nbdist.cluster.launch.plan import make_plan
from nbdist.errors import InvalidArgumentError
from nbdist.testing import free_port

from .conftest import stop_and_check

pytestmark = pytest.mark.cluster

SSHD_READY_S = 20.0
START_TIMEOUT_S = 90.0


def require(found: bool, what: str) -> None:
    """Skip without `what` on a developer's machine; fail in CI, which installs it."""
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing; .ci/run installs it (APT_PACKAGES)")
        pytest.skip(f"{what} is not installed")


@interactive
def replica_sum():
    ctx = nd.get_replica_context()
    rank = ctx.replica_id_in_sync_group
    return ctx.all_reduce("sum", torch.tensor(1.0 + rank)), __import__("os").getpid()


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return tmp_path


# -- settings (no processes) -------------------------------------------------------------------
def test_engines_run_nbdist_entry_point_and_slurm_places_them_on_the_hosts():
    plan = make_plan(hosts="node1:2,node2:2", launcher="slurm")
    settings = ipyparallel_settings(plan, heartbeat_ms=1000)
    section = settings.cluster_kwargs["config"].SlurmEngineSetLauncher
    assert section.engine_cmd == [sys.executable, "-m", "nbdist.cluster.launch._engine_main"]
    local = ipyparallel_settings(make_plan(n=2, gpu_ids=()), heartbeat_ms=1000)
    config = local.cluster_kwargs["config"]
    flag = f"--nbdist-parent={os.getpid()}"  # its processes outlive this one not even at start
    assert config.LocalEngineSetLauncher.engine_cmd[-1] == flag
    assert config.ControllerLauncher.controller_cmd[-1] == flag
    template = section.batch_template
    assert "#SBATCH --nodelist=node1,node2\n#SBATCH --ntasks-per-node=2\n" in template
    assert "#SBATCH --ntasks={n}" in template and template.endswith("srun {program_and_args}\n")
    assert "--gpus-per-task" not in template
    # engines on other machines must reach it: the address on the route to them, at start
    assert settings.controller_ip == ROUTE_TO_HOSTS
    gpu_job = ipyparallel_settings(
        make_plan(n=4, launcher="slurm", gpus="all"),
        heartbeat_ms=1000,
        options={"options": "--mem=4G", "account": "proj"},
    )
    assert gpu_job.controller_ip == ROUTE_TO_HOSTS  # srun places engines on other nodes
    assert (
        "#SBATCH --mem=4G\n"
        in gpu_job.cluster_kwargs["config"].SlurmEngineSetLauncher.batch_template
    )
    assert (
        "#SBATCH --gpus-per-task=1"
        in gpu_job.cluster_kwargs["config"].SlurmEngineSetLauncher.batch_template
    )


def test_ssh_settings_never_prompt_and_loopback_hosts_keep_the_controller_local():
    plan = make_plan(hosts="me@127.0.0.1:2,localhost", launcher="ssh")
    settings = ipyparallel_settings(plan, heartbeat_ms=1000, options={"ssh_args": ["-p", "2222"]})
    section = settings.cluster_kwargs["config"].SSHEngineSetLauncher
    assert section.engines == {"me@127.0.0.1": 2, "localhost": 1}
    assert section.ssh_args[:2] == ["-o", "BatchMode=yes"] and section.ssh_args[-2:] == [
        "-p",
        "2222",
    ]
    assert settings.controller_ip == "127.0.0.1"
    assert settings.remote_python == sys.executable  # the same machine: this Python
    remote = ipyparallel_settings(make_plan(hosts="node1", launcher="ssh"), heartbeat_ms=1000)
    assert remote.controller_ip == ROUTE_TO_HOSTS and remote.remote_python == "python3"


def test_the_controller_listens_on_one_address_never_on_every_interface():
    # chosen at start from the route to the first host (tests/hosts/ checks the sockets)
    settings = ipyparallel_settings(make_plan(hosts="node1", launcher="ssh"), heartbeat_ms=1000)
    assert settings.cluster_kwargs["controller_ip"] == ROUTE_TO_HOSTS
    with pytest.raises(ClusterStartError, match=r"'no-such-host\.invalid'.*controller_ip"):
        for_start(settings, make_plan(hosts="no-such-host.invalid:1", launcher="ssh"))
    given = ipyparallel_settings(
        make_plan(hosts="node1", launcher="ssh"), heartbeat_ms=1000,
        options={"controller_ip": "10.1.2.3"},
    )  # fmt: skip
    assert given.controller_ip == given.cluster_kwargs["controller_ip"] == "10.1.2.3"
    assert for_start(given, make_plan(hosts="node1", launcher="ssh")) is given
    for bad in ("0.0.0.0", "*", "eth0"):
        with pytest.raises(InvalidArgumentError, match=r"controller_ip.*one IP address"):
            ipyparallel_settings(
                make_plan(hosts="node1", launcher="ssh"), heartbeat_ms=1000,
                options={"controller_ip": bad},
            )  # fmt: skip


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_mpi_settings_name_the_hosts():
    settings = ipyparallel_settings(
        make_plan(hosts="node1:2,node2:2", launcher="mpi", gpus="none"), heartbeat_ms=1000
    )
    args = settings.cluster_kwargs["config"].MPIEngineSetLauncher.mpi_args
    assert "node1:2,node2:2" in args
    assert args[args.index("node1:2,node2:2") - 1] in ("--host", "-hosts")
    assert "CUDA_VISIBLE_DEVICES" in args  # forwarded to the other hosts: gpus='none'
    # ipyparallel names the cluster to MPI engines by environment only: forwarded too
    if "-x" in args:
        assert {"IPP_CLUSTER_ID", "IPP_PROFILE_DIR"} <= set(args)


# -- local -------------------------------------------------------------------------------------
def test_an_engine_that_exits_at_start_fails_the_start_at_once(ipython_dir):
    refuse = [sys.executable, "-c", "raise SystemExit('engine refuses to start')"]
    cluster = Cluster(n=2, timeout=60, launcher_options={"engine_cmd": refuse})
    begin = time.perf_counter()
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    assert time.perf_counter() - begin < 30  # not the 60 s registration timeout
    message = str(info.value)
    assert "exited before registering" in message
    assert "engine refuses to start" in message  # the engines' own output
    assert not cluster.running and cluster.processes == ()


# -- MPI ---------------------------------------------------------------------------------------
def test_mpi_launcher_starts_engines_in_one_group(ipython_dir):
    require(shutil.which("mpiexec") is not None, "mpiexec (openmpi-bin)")
    cluster = Cluster(n=2, launcher="mpi", timeout=START_TIMEOUT_S)
    try:
        cluster.start()
        rows = cluster.status()
        assert [row.state for row in rows] == ["alive", "alive"]
        sums, pids = cluster.strategy.run(replica_sum)
        assert [float(value) for value in sums.values] == [3.0, 3.0]
        assert set(pids.values) == {row.pid for row in rows}
        names = {_name(pid) for pid in cluster.processes}
        assert any("mpiexec" in name or "orterun" in name for name in names), names
    finally:
        stop_and_check(cluster)


def _name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


# -- SSH ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An sshd on 127.0.0.1 that accepts one key; yields the ssh options that use it."""
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    require(os.path.exists(binary) and shutil.which("ssh") is not None, "sshd (openssh-server)")
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
            check=True,
            timeout=30,
        )
    (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
    port = free_port()
    config = folder / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {folder / 'host_key'}",
                f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                f"PidFile {folder / 'sshd.pid'}",
                "StrictModes no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    process = subprocess.Popen(
        [binary, "-D", "-e", "-f", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_port(port, process)
        common = [
            "-i",
            str(folder / "client_key"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
        ]
        yield {
            "port": port,
            "ssh_args": ["-p", str(port), *common],
            "scp_args": ["-P", str(port), *common],
        }
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_for_port(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + SSHD_READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"sshd exited at start: {process.stdout.read() if process.stdout else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)  # polling a port that is not open yet (bounded by the deadline)
    pytest.fail(f"sshd did not listen on 127.0.0.1:{port} within {SSHD_READY_S} s")


def ssh_options(sshd, tmp_path: Path, **extra) -> dict:
    # The "remote" profile directory differs from the local one: the connection files are
    # copied there over scp (copying a file onto itself would truncate it).
    return {
        "ssh_args": sshd["ssh_args"],
        "scp_args": sshd["scp_args"],
        "remote_python": sys.executable,
        "remote_profile_dir": str(tmp_path / "remote-profile"),
        **extra,
    }


def test_ssh_launcher_starts_engines_over_ssh(sshd, ipython_dir):
    cluster = Cluster(
        hosts="127.0.0.1:2",
        launcher="ssh",
        timeout=START_TIMEOUT_S,
        launcher_options=ssh_options(sshd, ipython_dir),
    )
    assert cluster.num_engines == 2
    try:
        cluster.start()
        rows = cluster.status()
        assert [row.state for row in rows] == ["alive", "alive"]
        assert {row.host for row in rows} == {socket.gethostname()}
        sums, _ = cluster.strategy.run(replica_sum)
        assert [float(value) for value in sums.values] == [3.0, 3.0]
        # The engines run under the test's sshd, not as children of this process.
        import psutil

        engine = psutil.Process(rows[0].pid)
        assert os.getpid() not in {parent.pid for parent in engine.parents()}
    finally:
        stop_and_check(cluster)


def test_a_port_without_sshd_fails_within_the_timeout(sshd, ipython_dir):
    closed = free_port()
    options = ssh_options(sshd, ipython_dir)
    options["ssh_args"] = [*sshd["ssh_args"][2:], "-p", str(closed)]
    options["scp_args"] = [*sshd["scp_args"][2:], "-P", str(closed)]
    cluster = Cluster(hosts="127.0.0.1", launcher="ssh", timeout=30, launcher_options=options)
    begin = time.perf_counter()
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    assert time.perf_counter() - begin < 30
    message = str(info.value)
    assert f"127.0.0.1: ssh exited with 255: ssh: connect to host 127.0.0.1 port {closed}" in (
        message
    )
    assert "Connection refused" in message
    assert "without a password" in message
    assert not cluster.running and cluster.processes == ()


def test_an_unknown_host_fails_within_the_timeout(sshd, ipython_dir):
    cluster = Cluster(
        hosts="no-such-host.invalid:2",
        launcher="ssh",
        timeout=30,
        launcher_options=ssh_options(sshd, ipython_dir),
    )
    begin = time.perf_counter()
    with pytest.raises(ClusterStartError, match=r"no-such-host\.invalid: ssh exited with 255"):
        cluster.start()
    assert time.perf_counter() - begin < 30
    assert not cluster.running


def test_a_host_python_without_nbdist_is_named(sshd, ipython_dir, tmp_path):
    # A Python with no nbdist installed: the engine exits at once; no wait for the timeout.
    bare = tmp_path / "bare-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60
    )
    cluster = Cluster(
        hosts="127.0.0.1",
        launcher="ssh",
        timeout=60,
        launcher_options=ssh_options(sshd, ipython_dir, remote_python=str(bare / "bin" / "python")),
    )
    begin = time.perf_counter()
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    assert time.perf_counter() - begin < 45
    message = str(info.value)
    assert f"127.0.0.1: its Python '{bare / 'bin' / 'python'}' cannot run nbdist" in message
    assert "No module named" in message and "launcher_options={'remote_python'" in message
    assert not cluster.running


def test_replicas_follow_the_hosts_order_whatever_order_engines_registered_in():
    # ssh starts every engine at once: h2's may register first; rank 0 stays on h1
    from nbdist.cluster.launch.startup import rank_engines

    plan = make_plan(hosts="me@h1:2,h2:2", launcher="ssh")
    described = [
        {"host": host, "cuda_visible_devices": None, "address": address, "free_port": 1000 + i}
        for i, (host, address) in enumerate(
            [("h2", "10.0.0.2"), ("h1", "10.0.0.1"), ("h2", "10.0.0.2"), ("h1", "10.0.0.1")]
        )
    ]
    ranked = rank_engines(plan, [0, 1, 2, 3], described)
    assert [(engine_id, info["host"]) for engine_id, info, _ in ranked] == [
        (1, "h1"), (3, "h1"), (0, "h2"), (2, "h2")
    ]  # fmt: skip
    assert ranked[0][2]["master_addr"] == "10.0.0.1"
    assert [config["local_rank"] for _, _, config in ranked] == [0, 1, 0, 1]
