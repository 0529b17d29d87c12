"""How a `LaunchPlan` maps onto ipyparallel: its `Cluster` arguments and launcher settings.

nbdist writes no process launcher: engines are started by ipyparallel's engine-set launchers
(`local`, `ssh`, `mpi`, `slurm`). This module decides their settings from the plan:

- every launcher runs `python -m nbdist.cluster.launch._engine_main` (ipyparallel's engine, with
torch
  imported first) instead of `python -m ipyparallel.engine`;
- `local`: the engines are forked from a zygote (Note [Engines from a zygote]); with
  `NBDIST_ZYGOTE=0`, or without `os.fork`, they start before the controller as Pythons of
  their own and wait for its connection file, so their imports overlap its start-up;
- `ssh`: `SSHEngineSetLauncher.engines = {host: count}`; ssh never prompts (`BatchMode=yes`)
  and gives up on an unreachable host within the cluster's timeout (`ConnectTimeout`); the
  hosts are started at once and a stop is quiet about engines already gone (`SSH_LAUNCHER`);
- `mpi`: `mpiexec -n N`, with `--host h1:2,h2:2` for hosts (Open MPI's spelling; MPICH's
  `-hosts`), and Open MPI's `--allow-run-as-root` when running as root (containers);
- `slurm`: one `sbatch` job of N tasks (`--nodelist`/`--ntasks-per-node` for hosts), its
  output in the profile's log folder (where start errors read it), not `slurm-JOBID.out`.

Note [Schedulers in threads]: ipyparallel's controller runs its queues and schedulers (mux,
control, iopub, the task scheduler and three broadcast schedulers) as processes of their own by
default: seven more processes starting at once on a small machine, for schedulers nbdist does
not use (it sends only to direct views). `IPController.use_threads=True` runs them as threads
of the controller (6 processes for a 2-engine cluster instead of 13).

Note [Engines from a zygote]: a local engine started as a new Python imports torch,
ipyparallel's engine and nbdist's engine side (~2 s of CPU on a small machine; N engines pay it
N times). `Cluster.start` starts one zygote process first, which imports them once while the
controller comes up, and ipyparallel's local launcher is replaced by `ZygoteEngineSetLauncher`,
which asks the zygote to fork each engine (same command line, environment and log file). The
controller is started first then: the launcher waits for the zygote's imports.

The controller listens on 127.0.0.1 unless engines run on other machines; then on one address
of this machine, never on every interface: `launcher_options={"controller_ip": ADDRESS}`, or
else the address the route to the first host leaves from, chosen when the cluster starts
(`for_start`; the hosts need not resolve before). `options` are extra settings for the
engine-set launcher (`remote_python`, `ssh_args`, `mpi_args`, `account`, ...), checked against
its configurable traits. Imports ipyparallel only inside `ipyparallel_settings`.

Example:
    >>> from nbdist.cluster.launch.plan import make_plan
    >>> settings = ipyparallel_settings(make_plan(n=2, gpu_ids=()), heartbeat_ms=1000)
    >>> settings.cluster_kwargs["engine_launcher_class"] == (
    ...     ZYGOTE_LAUNCHER if settings.zygote else "local")
    True
    >>> settings.controller_ip
    '127.0.0.1'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from nbdist.cluster.launch import slurm_jobs
from nbdist.cluster.launch._controller_main import CONTROLLER_MODULE, START_ENGINES_FLAG
from nbdist.cluster.launch.parent_watch import NO_PARENT_FLAG, parent_flag
from nbdist.cluster.launch.plan import LaunchPlan
from nbdist.cluster.launch.zygote import ENGINE_MODULE, zygote_wanted

__all__ = [
    "CONTROLLER_MODULE",
    "ENGINE_MODULE",
    "ROUTE_TO_HOSTS",
    "SPARE_CONTROLLER_LAUNCHER",
    "SSH_LAUNCHER",
    "IpyparallelSettings",
    "for_start",
    "ipyparallel_settings",
    "is_loopback",
    "probe_hosts",
]

STOP_KILL_S = 2
"""Seconds a local engine gets to exit after SIGTERM before it is killed (a normal engine
exits at once: `_engine_main`)."""

ZYGOTE_LAUNCHER = "nbdist.cluster.launch.zygote_launcher.ZygoteEngineSetLauncher"
"""The engine-set launcher of local engines forked from a zygote."""
SPARE_CONTROLLER_LAUNCHER = "nbdist.cluster.launch.controller_launcher.SpareControllerLauncher"
"""The controller launcher that hands the command line to a spare controller (kept warm)."""

SSH_LAUNCHER = "nbdist.cluster.launch.ssh_launcher.ConcurrentSSHEngineSetLauncher"
"""The engine-set launcher of ssh engines: ipyparallel's, its hosts started at once and its
stop quiet about engines that already exited (`ssh_launcher`)."""

ROUTE_TO_HOSTS = "route-to-hosts"
"""`IpyparallelSettings.controller_ip` until the cluster starts, when no address was given: the
address of this machine on the route to the first host (`for_start`)."""

_LAUNCHER_CLASSES = {
    "local": "LocalEngineSetLauncher",
    "ssh": "SSHEngineSetLauncher",
    "mpi": "MPIEngineSetLauncher",
    "slurm": "SlurmEngineSetLauncher",
}

_SLURM_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=nbdist-{cluster_id}
#SBATCH --output={output_file}
#SBATCH --ntasks={n}
"""


@dataclasses.dataclass(frozen=True)
class IpyparallelSettings:
    """What `Cluster.start` passes to ipyparallel.

    Attributes:
        cluster_kwargs: Keyword arguments of `ipyparallel.Cluster(...)` (the traitlets
            `config` with the launcher's settings included).
        engines_first: Start the engines before the controller (they wait for its file).
        controller_ip: The address the controller listens on.
        launcher_class: The ipyparallel engine-set launcher's class name.
        ssh_command: For ssh, the command (with options) that reaches a host.
        remote_python: For ssh, the Python the engines run on the hosts.
        zygote: Local engines are forked from a zygote (`zygote.Zygote`; its socket is set
            in `cluster_kwargs["config"]` by `Cluster.start`).
    """

    cluster_kwargs: dict[str, Any]
    engines_first: bool
    controller_ip: str
    launcher_class: str
    ssh_command: tuple[str, ...] = ()
    remote_python: str = ""
    zygote: bool = False


def is_loopback(host: str) -> bool:
    """True for `localhost`, `127.x.y.z` and `::1` (with or without a `user@` prefix).

    Example:
        >>> is_loopback("me@127.0.0.1"), is_loopback("node1")
        (True, False)
    """
    name = host.rpartition("@")[2].strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def ipyparallel_settings(
    plan: LaunchPlan,
    *,
    heartbeat_ms: int,
    profile_dir: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> IpyparallelSettings:
    """The ipyparallel `Cluster` arguments that start `plan`'s engines.

    Args:
        plan: The checked plan.
        heartbeat_ms: The controller's heartbeat period.
        profile_dir: ipyparallel profile directory (default: ipyparallel's).
        options: Extra traits of the engine-set launcher, e.g. `{"remote_python":
            "/opt/venv/bin/python"}` for ssh.

    Raises:
        ValueError: an option the launcher does not have (the valid ones are listed).
        RuntimeError: `mpiexec` or `mpi4py` missing for the mpi launcher (the fix is named).
    """
    from traitlets.config import Config

    launcher_class = _LAUNCHER_CLASSES[plan.launcher]
    config = Config()
    config.ControllerLauncher.connection_info_timeout = float(plan.timeout)
    # --nbdist-parent: a process started just as its starter dies still stops (parent_watch)
    # --nbdist-start-engines: beat fast until that many engines registered (_controller_main)
    config.ControllerLauncher.controller_cmd = [
        sys.executable, "-m", CONTROLLER_MODULE, f"{START_ENGINES_FLAG}{plan.n}", parent_flag()
    ]  # fmt: skip
    section = config[launcher_class]
    if plan.launcher == "slurm":  # srun places engines on the allocation's nodes
        remote_hosts = not plan.hosts or not all(is_loopback(h) for h, _ in plan.hosts)
    else:
        remote_hosts = plan.hosts is not None and not all(is_loopback(h) for h, _ in plan.hosts)
    options = dict(options or {})
    controller_ip = _given_address(options.pop("controller_ip", None))
    if controller_ip is None:
        controller_ip = ROUTE_TO_HOSTS if remote_hosts else "127.0.0.1"
    engine_cmd = [sys.executable, "-m", ENGINE_MODULE]
    engine_args: list[str] = []
    ssh_command: list[str] = []
    if plan.launcher == "local":
        # An engine that does not exit on SIGTERM (blocked in C, or its code ignores the
        # signal) is killed after STOP_KILL_S, so a stop stays within 5 s (ipyparallel: 5 s).
        config.LocalEngineLauncher.stop_seconds_until_kill = STOP_KILL_S
        engine_cmd.append(parent_flag())
        engine_args.append(f"--IPEngine.wait_for_url_file={float(plan.timeout)}")
    elif plan.launcher == "ssh":
        remote_python = (options or {}).get("remote_python")
        if remote_python is None:
            remote_python = "python3" if remote_hosts else sys.executable
        # No parent to watch: ipyparallel's ssh receiver starts the engine and exits at once
        # (the engine would take that for its starter's death and stop); `stop()` stops
        # ssh engines through the same receiver.
        engine_cmd = [str(remote_python), "-m", ENGINE_MODULE, NO_PARENT_FLAG]
        assert plan.hosts is not None
        section.engines = {host: count for host, count in plan.hosts}
        quiet = _ssh_safety(plan.timeout)
        section.ssh_args = quiet + list((options or {}).get("ssh_args", []))
        section.scp_args = quiet + list((options or {}).get("scp_args", []))
        ssh_command = list((options or {}).get("ssh_cmd", ["ssh"])) + section.ssh_args
    elif plan.launcher == "mpi":
        section.mpi_args = _mpi_args(plan) + list((options or {}).get("mpi_args", []))
    elif plan.launcher == "slurm":
        section.batch_template = _slurm_template(plan, str((options or {}).get("options", "")))
        # sbatch's complaints kept in the error, the job id read from its answer (slurm_jobs)
        section.submit_command = list(slurm_jobs.SUBMIT_COMMAND)
        section.delete_command = list(slurm_jobs.DELETE_COMMAND)
        section.job_id_regexp = slurm_jobs.JOB_ID_REGEXP
        section.job_id_regexp_group = 1
    section.engine_cmd = engine_cmd
    section.engine_args = engine_args
    for key, value in (options or {}).items():
        if key not in ("ssh_args", "scp_args", "mpi_args"):
            section[key] = value
    _check_options(launcher_class, options or {})
    zygote = zygote_wanted(plan.launcher)
    if zygote:  # Note [Engines from a zygote]
        config.ZygoteEngineLauncher.zygote_socket = ""  # Cluster.start sets it
    engine_launcher: str = plan.launcher
    if zygote:
        engine_launcher = ZYGOTE_LAUNCHER
    elif plan.launcher == "ssh":
        engine_launcher = SSH_LAUNCHER
    kwargs: dict[str, Any] = {
        "n": plan.n,
        "engine_launcher_class": engine_launcher,
        "controller_ip": controller_ip,
        "controller_args": [
            # one controller process instead of eight (Note [Schedulers in threads])
            "--IPController.use_threads=True",
            f"--HeartMonitor.period={int(heartbeat_ms)}",
            # tolerate 10 s without a beat whatever the period (at least ipyparallel's 10)
            f"--HeartMonitor.max_heartmonitor_misses={max(10, math.ceil(10_000 / heartbeat_ms))}",
        ],
        "delay": 0.0,
        "engine_timeout": math.ceil(plan.timeout),
        "log_level": logging.WARNING,
        "config": config,
        "shutdown_atexit": False,  # nd.Cluster stops its clusters at exit itself
    }
    if zygote:
        # forked at once, not after the controller has written its connection file: they
        # wait for the file (wait_for_url_file) while they start their nannies
        kwargs["send_engines_connection_env"] = False
    if profile_dir is not None:
        kwargs["profile_dir"] = profile_dir
    return IpyparallelSettings(
        cluster_kwargs=kwargs,
        engines_first=plan.launcher == "local" and not zygote,
        controller_ip=controller_ip,
        launcher_class=launcher_class,
        ssh_command=tuple(ssh_command),
        remote_python=engine_cmd[0],
        zygote=zygote,
    )


def for_start(settings: IpyparallelSettings, plan: LaunchPlan) -> IpyparallelSettings:
    """`settings` with the controller's address decided: the address of this machine on the
    route to the first host that is not this one (`ROUTE_TO_HOSTS`); for Slurm without hosts,
    the address this machine's name resolves to, else the one on its default route.

    Raises:
        ClusterStartError: no address of this machine reaches the hosts (the fix is named).
    """
    if settings.controller_ip != ROUTE_TO_HOSTS:
        return settings
    from nbdist.cluster.addresses import address_towards

    remote = [host for host, _ in plan.hosts or () if not is_loopback(host)]
    if remote:
        chosen = address_towards(remote[0])
        towards = f"the first host, {remote[0]!r}"
    else:  # Slurm places the engines: this machine's own address on the cluster's network
        chosen = None
        with contextlib.suppress(OSError):
            named = socket.gethostbyname(socket.gethostname())
            chosen = None if named.startswith("127.") else named
        chosen = chosen or slurm_jobs.controller_route()  # the network slurmctld is on
        chosen = chosen or address_towards("198.51.100.1")  # a route lookup; nothing is sent
        towards = "the Slurm nodes"
    if chosen is None or chosen.startswith("127."):
        from nbdist.cluster.errors import ClusterStartError

        raise ClusterStartError(
            f"Cannot tell which address of this machine reaches {towards} (the name does not "
            "resolve, or no route leads there), so the controller has no address to listen "
            "on. Check the host name, or give the address the engines reach this machine at: "
            "launcher_options={'controller_ip': '10.0.0.5'}."
        )
    kwargs = {**settings.cluster_kwargs, "controller_ip": chosen}
    return dataclasses.replace(settings, cluster_kwargs=kwargs, controller_ip=chosen)


def _given_address(value: Any) -> str | None:
    """A `controller_ip` launcher option, checked: an IP address of this machine."""
    if value is None:
        return None
    try:
        address = str(ipaddress.ip_address(str(value)))
    except ValueError:
        address = None
    if address is None or address in ("0.0.0.0", "::"):
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"launcher_options controller_ip={value!r} is not one IP address; give the address "
            "of this machine that the engines reach, e.g. controller_ip='10.0.0.5' (every "
            "interface, 0.0.0.0, is not allowed)."
        )
    return address


def probe_hosts(
    settings: IpyparallelSettings, hosts: Sequence[str], remote_python: str, timeout: float
) -> None:
    """Log in to every host once, all at once, and check its Python before starting engines.

    Runs `ssh HOST REMOTE_PYTHON -c ...` that imports nbdist and ipyparallel and prints the
    Python and nbdist versions. ipyparallel's ssh launcher reports an unreachable host only as
    "Unable to get remote shell information", and a Python without nbdist as a failed command;
    this names the host, shows what ssh or Python said, and the fix. Engines must run the same
    Python minor version and nbdist version as the notebook (functions travel pickled).

    Raises:
        HostUnreachableError: (a `ConnectionError`) a host that ssh could not reach or log in
            to, whose Python lacks nbdist or ipyparallel, or whose versions differ.
    """
    import importlib.metadata
    from concurrent.futures import ThreadPoolExecutor

    import nbdist

    try:
        version = importlib.metadata.version("nbdist")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = nbdist.__version__
    here = f"{sys.version_info[0]}.{sys.version_info[1]} {version}"
    check = (  # finds the packages without importing them (torch would take seconds)
        "import sys, importlib.util as u, importlib.metadata as m; "
        "missing = [p for p in ('ipyparallel', 'torch', 'nbdist') if u.find_spec(p) is None]; "
        "missing and sys.exit(f'No module named {missing[0]!r}'); "
        "print('nbdist-probe', f'{sys.version_info[0]}.{sys.version_info[1]}', m.version('nbdist'))"
    )

    def probe(host: str) -> str | None:
        command = [*settings.ssh_command, host, remote_python, "-c", f'"{check}"']
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{host}: no answer within {timeout:g} s"
        except OSError as error:
            return f"{host}: cannot run {command[0]!r}: {error}"
        said = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode == 255:
            return f"{host}: ssh exited with 255: {said or '(ssh printed nothing)'}"
        if done.returncode != 0:
            return (
                f"{host}: its Python {remote_python!r} cannot run nbdist's engines ({said}). "
                "Install nbdist there (`pip install nbdist`), or point "
                "launcher_options={'remote_python': '/path/to/python'} at a Python that has it"
            )
        found = [line for line in done.stdout.splitlines() if line.startswith("nbdist-probe ")]
        there = found[-1].split(" ", 1)[1] if found else "?"
        if there != here:
            return (
                f"{host}: {remote_python!r} has Python/nbdist {there}, the notebook {here}; "
                "engines need the same Python minor version and nbdist version (functions are "
                "sent pickled). Install the same versions there"
            )
        return None

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        problems = [problem for problem in pool.map(probe, hosts) if problem]
    if problems:
        from nbdist.cluster.errors import HostUnreachableError

        raise HostUnreachableError(
            "Cannot start engines on every host over ssh:\n  "
            + "\n  ".join(problems)
            + "\nssh must log in without a password prompt (a key in ssh-agent or "
            "~/.ssh/config); pass ssh options with launcher_options={'ssh_args': [...]}."
        )


def _ssh_safety(timeout: float) -> list[str]:
    """ssh options: never prompt for a password or a host key, give up on silent hosts."""
    connect = max(1, min(30, math.ceil(timeout / 4)))
    return ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}"]


@functools.lru_cache(maxsize=4)
def _mpi_flavour(mpiexec: str) -> str:
    """`"openmpi"`, `"mpich"` or `"unknown"`, from `mpiexec --version`."""
    try:
        text = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    output = (text.stdout + text.stderr).lower()
    if "open mpi" in output or "open-mpi" in output or "openrte" in output:
        return "openmpi"
    if "hydra" in output or "mpich" in output or "intel" in output:
        return "mpich"
    return "unknown"


def _mpi_args(plan: LaunchPlan) -> list[str]:
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        from nbdist.cluster.errors import ClusterStartError

        raise ClusterStartError(
            "launcher='mpi' needs `mpiexec` on PATH, and none was found. Install an MPI "
            "(Debian/Ubuntu: `apt-get install openmpi-bin`), or use launcher='local' or 'ssh'."
        )
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        from nbdist.cluster.errors import ClusterStartError

        raise ClusterStartError(
            "launcher='mpi' starts ipyparallel engines with --mpi, which needs mpi4py in this "
            f"Python ({sys.executable}). Install it: `pip install mpi4py` (or "
            "`pip install 'nbdist[mpi]'`)."
        )
    flavour = _mpi_flavour(mpiexec)
    args: list[str] = []
    if flavour == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-run-as-root")  # notebooks in containers often run as root
    if plan.hosts:
        spelled = ",".join(f"{host}:{count}" for host, count in plan.hosts)
        args += ["-hosts", spelled] if flavour == "mpich" else ["--host", spelled]
    elif flavour == "openmpi" and plan.n > (os.cpu_count() or 1):
        args.append("--oversubscribe")  # more engines than cores on this machine, as asked
    environment = dict(plan.engine_sets()[0][1])
    environment["MPLBACKEND"] = "Agg"  # set for every engine set by Cluster; forward it too
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # set by Cluster for every engine set
        environment[key] = ""
    # ipyparallel tells MPI engines their cluster by environment, not arguments: on other
    # hosts mpiexec passes only the variables it is told to (Open MPI's -x)
    environment["IPP_CLUSTER_ID"] = environment["IPP_PROFILE_DIR"] = ""
    if plan.hosts:
        if flavour == "mpich":
            args += ["-genvlist", ",".join(environment)]
        else:
            for key in environment:
                args += ["-x", key]
    return args


def _slurm_template(plan: LaunchPlan, extra: str = "") -> str:
    """The engines' batch script; `extra` is more `sbatch` options (`options`), one line."""
    lines = [_SLURM_TEMPLATE.rstrip("\n")]
    if extra.strip():
        lines.append(f"#SBATCH {extra.strip()}")
    if plan.hosts:
        counts = {count for _, count in plan.hosts}
        if len(counts) != 1:
            from nbdist.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"launcher='slurm' places the same number of engines on every node, but "
                f"hosts={plan.hosts!r} asks for different counts. Give every host the same "
                "count, or leave hosts out and let Slurm place n engines."
            )
        lines.append(f"#SBATCH --nodelist={','.join(host for host, _ in plan.hosts)}")
        lines.append(f"#SBATCH --ntasks-per-node={counts.pop()}")
    if plan.gpus_required:
        lines.append("#SBATCH --gpus-per-task=1")
    lines.append("srun {program_and_args}")
    return "\n".join(lines) + "\n"


def _check_options(launcher_class: str, options: Mapping[str, Any]) -> None:
    if not options:
        return
    import ipyparallel.cluster.launcher as launchers

    cls = getattr(launchers, launcher_class)
    valid = set(cls.class_trait_names(config=True))
    unknown = sorted(set(options) - valid)
    if unknown:
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"launcher_options {unknown} are not settings of ipyparallel's {launcher_class}; "
            f"valid ones: {', '.join(sorted(valid))}."
        )
