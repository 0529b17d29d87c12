"""A real Slurm on the namespace hosts of `nbdist.testing.hosts`: munge, slurmctld, slurmd.

Debian's `slurmctld`, `slurmd` and `munged` (packages `slurmctld slurmd munge slurm-client`)
run as root with a `slurm.conf` written here: `slurmctld` on the notebook's host `nb` (its
198.18 address), one `slurmd` per engine host inside that host's namespace (so job steps run
there, with that host's network and hostname), each host a node with 2 CPUs in one default
partition `debug`. `munged` has a key made for the cluster and a socket in the cluster's
folder (a path, so every namespace reaches it). Processes are tracked by
`proctrack/linuxproc`, tasks are not bound (`task/none`): no cgroups are needed. State, spool
and logs live in a temporary folder, removed on `close()`, which cancels every job and stops
every daemon and job step by pid (the hosts' own `close()` stops anything left as well).

Slurm's clients (`srun`, `sbatch`, `squeue`, `scancel`) find this cluster through
`SLURM_CONF` (`env`); run them on a host with `run` (the notebook's host by default).

Example (as root)::

    with host_cluster(2) as hosts, slurm_cluster(hosts) as slurm:
        print(slurm.run(["srun", "-N2", "-n2", "hostname"]).stdout)   # h1, h2
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from nbdist.testing.hosts import (
    NOTEBOOK_HOST,
    HostCluster,
    HostSetupError,
    _stop_pids,
    alive,
    brought_up,
)

__all__ = ["CPUS_PER_NODE", "PARTITION", "SlurmCluster", "skip_reason", "slurm_cluster"]

CPUS_PER_NODE = 2
"""CPUs each node offers Slurm (whatever this machine has: `SlurmdParameters=config_overrides`)."""
PARTITION = "debug"
"""The one partition, the default, with every engine host in it."""
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
_READY_S = 60.0
_POLL_S = 0.1


def skip_reason() -> str | None:
    """Why a Slurm cannot be run here (None when it can): a missing daemon or client.

    Example:
        >>> skip_reason() is None or "install" in skip_reason()
        True
    """
    for tool in (*_DAEMONS, *_CLIENTS):
        if _which(tool) is None:
            return (
                f"`{tool}` is missing (install Debian's slurmctld slurmd munge slurm-client: "
                "`apt-get install slurmctld slurmd munge slurm-client`)"
            )
    return None


class SlurmCluster:
    """Slurm on `hosts`: the controller on `nb`, a node per engine host. Use `slurm_cluster`.

    Attributes:
        hosts: The namespace hosts it runs on.
        folder: Its configuration, key, state, spool and logs.
        conf: The `slurm.conf` (`SLURM_CONF`).
        nodes: The node names (the engine hosts' names, h1 first).
        pids: The daemons' pids by name (`munged`, `slurmctld`, `slurmd.h1`, ...).
    """

    def __init__(self, hosts: HostCluster, folder: Path | None = None) -> None:
        self.hosts = hosts
        self.folder = Path(folder or tempfile.mkdtemp(prefix=f"nbdist-slurm-{hosts.token}-"))
        self.conf = self.folder / "slurm.conf"
        self.nodes = [host.name for host in hosts.engine_hosts]
        self.pids: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to find this cluster: `{"SLURM_CONF": ...}`."""
        return {"SLURM_CONF": str(self.conf)}

    def run(
        self,
        argv: Sequence[str],
        *,
        host: str = NOTEBOOK_HOST,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client (or anything needing `SLURM_CONF`) on `host`, output captured."""
        merged = {**_client_env(), **self.env, **(env or {})}
        return self.hosts.run(host, list(argv), timeout=timeout, check=check, env=merged)

    def jobs(self) -> list[str]:
        """`JOBID STATE NAME` of every job Slurm knows (running or pending)."""
        done = self.run(["squeue", "-h", "-o", "%i %T %j"], timeout=30)
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def log(self, daemon: str) -> str:
        """The log of `daemon` (`slurmctld`, `slurmd.h1`, `munged`), '' when it has none."""
        path = self.folder / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- making and removing -----------------------------------------------------------------
    def up(self) -> SlurmCluster:
        """Write the key and `slurm.conf`, start munged, slurmctld and the slurmds, and wait
        until every node is idle. On any failure what was started is stopped, and the error
        (with the daemons' logs) propagates."""
        try:
            self._write_files()
            self._start("munged", NOTEBOOK_HOST, [
                _which("munged"), "--foreground", "--force",
                f"--socket={self._socket}", f"--key-file={self.folder / 'munge.key'}",
                f"--log-file={self.folder / 'munged.log'}",
                f"--pid-file={self.folder / 'munged.pid'}",
                f"--seed-file={self.folder / 'munged.seed'}",
            ])  # fmt: skip
            self._wait_for(self._socket.exists, "munged's socket")
            self._start("slurmctld", NOTEBOOK_HOST, [
                _which("slurmctld"), "-D", "-i", "-f", str(self.conf),
            ])  # fmt: skip
            for node in self.nodes:
                self._start(f"slurmd.{node}", node, [
                    _which("slurmd"), "-D", "-N", node, "-f", str(self.conf),
                ])  # fmt: skip
            self._wait_for(self._all_idle, "every node to be idle")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Cancel every job, stop the daemons and any job step left by pid, remove the folder.
        Safe to call twice, and on a half-started cluster."""
        if self.pids.get("slurmctld") and alive(self.pids["slurmctld"]):
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", f"--partition={PARTITION}"], timeout=20,
                         check=False)  # fmt: skip
        order = [f"slurmd.{node}" for node in self.nodes] + ["slurmctld", "munged"]
        _stop_pids([self.pids[name] for name in order if name in self.pids])
        # job steps (slurmstepd and what it started) outlive a stopped slurmd: stop them too
        for node in self.nodes:
            if node in self.hosts.hosts:
                keep = {self.hosts.sshd_pids.get(node)}
                with contextlib.suppress(Exception):
                    _stop_pids([p for p in self.hosts.pids(node) if p not in keep])
        self.pids.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def _socket(self) -> Path:
        return self.folder / "munge.socket"

    def _write_files(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for sub in ("state", *(f"spool/{node}" for node in self.nodes)):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        controller = self.hosts.notebook
        lines = [
            f"ClusterName=nbd{self.hosts.token}",
            f"SlurmctldHost={controller.name}({controller.address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self._socket}",
            f"StateSaveLocation={self.folder / 'state'}",
            f"SlurmdSpoolDir={self.folder / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.folder / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={self.folder / 'slurmctld.log'}",
            f"SlurmdLogFile={self.folder / 'slurmd.%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            # a job Slurm can never run is refused at submission, not left pending
            "EnforcePartLimits=ALL",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "KillWait=5",
            "MinJobAge=2",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for host in self.hosts.engine_hosts:
            lines.append(
                f"NodeName={host.name} NodeAddr={host.address} NodeHostname={host.name} "
                f"CPUs={CPUS_PER_NODE} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        # slurmd loads a cgroup plugin whatever the other plugins; inside `ip netns exec`
        # /sys is a fresh sysfs with no cgroups: name v1 and an empty folder, none is used
        (self.folder / "cgroup").mkdir(exist_ok=True)
        (self.folder / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={self.folder / 'cgroup'}\n"
        )

    def _start(self, name: str, host: str, argv: Sequence[str | None]) -> None:
        log = open(self.folder / f"{name}.out", "w")  # noqa: SIM115 - the daemon's output
        with log:
            process = self.hosts.popen(
                host, [str(a) for a in argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**_client_env(), **self.env}, start_new_session=True,
            )  # fmt: skip
        self.pids[name] = process.pid  # ip, unshare and sh exec the next: the daemon's pid

    def _all_idle(self) -> bool:
        for name, pid in self.pids.items():
            if not alive(pid):
                raise HostSetupError(f"{name} exited while starting:\n{self._logs()}")
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30, check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + _READY_S
        while not ready():
            if time.monotonic() > deadline:
                raise HostSetupError(f"Slurm: no {what} within {_READY_S:g} s:\n{self._logs()}")
            time.sleep(_POLL_S)  # polling for the daemons (bounded by the deadline)

    def _logs(self) -> str:
        parts = []
        for path in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {path.name}:\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)


@contextlib.contextmanager
def slurm_cluster(hosts: HostCluster) -> Iterator[SlurmCluster]:
    """A running `SlurmCluster` on `hosts`, stopped and removed on exit.

    Raises:
        HostSetupError: `skip_reason()` is not None (its text says why), or a daemon would not
            start (their logs are in the message).
    """
    with brought_up(skip_reason(), lambda: SlurmCluster(hosts).up()) as cluster:
        yield cluster


def job_ids(text: str) -> list[str]:
    """The job ids in `sbatch`'s or `squeue`'s output ("Submitted batch job 12" -> ["12"])."""
    return re.findall(r"Submitted batch job (\d+)", text)


def _client_env() -> dict[str, str]:
    """This process's environment without Slurm's job variables (a test may run in a job)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def _which(tool: str) -> str | None:
    for folder in (None, "/usr/sbin", "/usr/bin"):
        found = shutil.which(tool, path=folder)
        if found:
            return found
    return None
