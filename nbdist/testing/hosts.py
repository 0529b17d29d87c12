"""A test cluster of "hosts" on this machine: Linux network namespaces joined by a bridge.

Each host is a network namespace with its own network stack, its own address from
198.18.0.0/15 (the range reserved for network tests; the namespaces have no route anywhere
else), its own hostname (every process is started in a UTS namespace of its own by
`unshare --uts`, named after the host), an `/etc/netns/<namespace>/hosts` that makes every
host's name resolve in each of them (`ip netns exec` mounts it over `/etc/hosts`), and its own
`sshd` on port 22 of its address, which accepts a client key made for the cluster. The first
host, `nb`, plays the notebook's machine; the others, `h1`, `h2`, ..., run engines.

Note [Host names and files]: namespaces are named `nbd-<token>-<host>` and the bridge
`nbdbr<token>` (a random token), so clusters made at once do not meet; each cluster has its own
bridge, so they may all use the same addresses. Every host shares this machine's file system:
the same Python, the same nbdist, the same temporary directory.

Note [Own name]: as on a Debian machine, each host's own name resolves to 127.0.1.1 on that
host (and to its address everywhere else), so a program that finds "its address" from its
hostname gets one no other host reaches, as it would on real machines set up that way.

Everything is removed on `close()` (also when setting up failed half-way): every process in
each namespace stopped by pid (SIGTERM, then SIGKILL), the namespaces (their veths go with
them), the bridge and the `/etc/netns` folders. Needs root and `ip netns`; `skip_reason()`
says why not where they are missing.

From a shell::

    python -m nbdist.testing.hosts up 2          # nb, h1, h2; prints the state file
    python -m nbdist.testing.hosts run nb -- ssh -F STATE_DIR/ssh_config h1 hostname
    python -m nbdist.testing.hosts down          # every cluster made by `up` (not tests')

Example (as root)::

    with host_cluster(2) as hosts:
        print(hosts.run("nb", ["ssh", *hosts.ssh_args, "h1", "hostname"]).stdout)  # h1
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "NOTEBOOK_HOST",
    "SUBNET",
    "Host",
    "HostCluster",
    "HostSetupError",
    "alive",
    "brought_up",
    "host_cluster",
    "skip_reason",
]

SUBNET = ipaddress.ip_network("198.18.0.0/24")
"""The hosts' subnet: part of 198.18.0.0/15, the range reserved for network tests."""
NOTEBOOK_HOST = "nb"
"""The name of the host that plays the notebook's machine."""
STATE_ROOT = Path(tempfile.gettempdir()) / "nbdist-hosts"
"""Where each cluster keeps its keys, sshd settings and `state.json`."""
_FIRST_ADDRESS = 10
_SSHD_READY_S = 20.0
_STOP_GRACE_S = 5.0
_POLL_S = 0.05


class HostSetupError(RuntimeError):
    """The namespace hosts could not be made or removed (what `ip` or sshd said is in it)."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One namespace host.

    Attributes:
        name: Its hostname (and the name other hosts resolve), e.g. "h1".
        netns: The network namespace's name (`ip netns exec NETNS ...`).
        address: Its IPv4 address on the bridge.
        veth: The bridge's end of its link, in this machine's namespace: `ip link set VETH
            down` cuts the host off; `tc qdisc ... dev VETH` shapes what it receives.
    """

    name: str
    netns: str
    address: str
    veth: str


def skip_reason() -> str | None:
    """Why namespace hosts cannot be made here (None when they can).

    Example:
        >>> skip_reason() is None or isinstance(skip_reason(), str)
        True
    """
    if not sys.platform.startswith("linux"):
        return "network-namespace hosts need Linux"
    if os.geteuid() != 0:
        return "network-namespace hosts need root (ip netns add, a bridge, veths)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (install {package})"
    if _sshd() is None:
        return "`sshd` is missing (install openssh-server)"
    done = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        return f"`ip netns` does not work here: {done.stderr.strip()}"
    return None


class HostCluster:
    """`n` engine hosts (`h1`..`hn`) and the notebook's host `nb`, made by `up()`.

    Use `host_cluster(n)` (a context manager) rather than this class directly. `ssh_args` are
    the ssh options that log in to any host (`ssh *ssh_args h1 CMD`), `ssh_config` the same as
    an ssh config file (`ssh -F ssh_config h1`).
    """

    def __init__(self, n: int, folder: Path | None = None, token: str | None = None) -> None:
        if n < 1:
            from nbdist.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"a host cluster needs at least 1 engine host, got n={n}; e.g. HostCluster(2)"
            )
        self.token = token or secrets.token_hex(3)
        self.folder = Path(folder) if folder else STATE_ROOT / self.token
        self.bridge = f"nbdbr{self.token}"
        names = [NOTEBOOK_HOST] + [f"h{i}" for i in range(1, n + 1)]
        self.hosts: dict[str, Host] = {
            name: Host(
                name=name,
                netns=f"nbd-{self.token}-{name}",
                address=str(SUBNET.network_address + _FIRST_ADDRESS + index),
                veth=f"nbd{self.token}{name}",
            )
            for index, name in enumerate(names)
        }
        self.sshd_pids: dict[str, int] = {}
        self.outsiders: set[str] = set()
        """Hosts on the bridge that are not in the cluster (`add_outsider`)."""
        self.from_shell = False
        """Made by `python -m nbdist.testing.hosts up` (what a bare `down` removes)."""

    # -- what tests use --------------------------------------------------------------------
    @property
    def notebook(self) -> Host:
        """The host that plays the notebook's machine."""
        return self.hosts[NOTEBOOK_HOST]

    @property
    def engine_hosts(self) -> list[Host]:
        """The hosts that run engines, h1 first."""
        return [
            host
            for name, host in self.hosts.items()
            if name != NOTEBOOK_HOST and name not in self.outsiders
        ]

    @property
    def client_key(self) -> Path:
        return self.folder / "client_key"

    @property
    def ssh_config(self) -> Path:
        return self.folder / "ssh_config"

    @property
    def ssh_args(self) -> list[str]:
        """ssh options that log in to every host as this user with the cluster's key."""
        return ["-F", str(self.ssh_config)]

    def dist_start_options(self, spec: str, folder: Path, timeout: float) -> str:
        """What `%dist start` is given to start engines over ssh on the hosts `spec` (e.g.
        `"h1:2,h2:2"`) within `timeout` seconds: ssh and scp with this cluster's config, this
        interpreter on the hosts, the engines' profile in `folder`.

        Example (makes network namespaces, so not run here)::

            kernel.execute(f"%dist start {hosts.dist_start_options('h1:2,h2:2', tmp, 240)}")
        """
        config = self.ssh_config
        return (
            f"--launcher ssh --hosts {spec} --timeout {timeout:g} "
            f"--launcher-option \"ssh_args=['-F', '{config}']\" "
            f"--launcher-option \"scp_args=['-F', '{config}']\" "
            f"--launcher-option remote_python={sys.executable} "
            f"--launcher-option remote_profile_dir={folder / 'remote-profile'}"
        )

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` as run on `host`: in its network namespace, with its hostname."""
        target = self.hosts[host]
        return [
            "ip", "netns", "exec", target.netns,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', target.name, *argv,
        ]  # fmt: skip

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` on `host` (`subprocess.Popen` arguments apply); the caller stops it,
        or `close()` does."""
        return subprocess.Popen(self.command(host, argv), **kwargs)

    def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run `argv` on `host` and wait for it (text output captured).

        Raises:
            subprocess.CalledProcessError: it failed and `check` (its output is in the error).
            subprocess.TimeoutExpired: it ran longer than `timeout` (it is killed).
        """
        return subprocess.run(
            self.command(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            env=dict(env) if env is not None else None,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def pids(self, host: str) -> list[int]:
        """The pids of every process in `host`'s network namespace."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.hosts[host].netns],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return [int(word) for word in done.stdout.split()]

    def processes(self, host: str, *, sshd: bool = False) -> list[str]:
        """`pid: command line` of every process on `host` (its sshd left out unless `sshd`)."""
        found = []
        for pid in self.pids(host):
            if not sshd and pid == self.sshd_pids.get(host):
                continue
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"{pid}: {text}")
        return found

    def listening(self, host: str) -> list[tuple[str, int, str]]:
        """`(address, port, program)` of every listening TCP socket on `host` (`ss -ltnp`)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].netns, "ss", "-H", "-ltnp"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        found = []
        for line in done.stdout.splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            address, _, port = fields[3].rpartition(":")
            program = fields[5] if len(fields) > 5 else ""
            found.append((address.strip("[]"), int(port), program))
        return found

    def add_outsider(self, name: str = "x") -> Host:
        """One more namespace on the bridge that is not in the cluster: the next address, the
        cluster's names in its hosts file, no sshd, no engines. `close()` removes it.

        Example (as root)::

            with host_cluster(1) as hosts:
                stranger = hosts.add_outsider()
                hosts.run(stranger.name, ["ping", "-c1", "h1"])
        """
        host = Host(
            name=name,
            netns=f"nbd-{self.token}-{name}",
            address=str(SUBNET.network_address + _FIRST_ADDRESS + len(self.hosts)),
            veth=f"nbd{self.token}{name}",
        )
        self.hosts[name] = host
        self.outsiders.add(name)
        self.save_partial()
        others = [f"{h.address} {h.name}" for h in self.hosts.values()]
        self._add_host(host, others)
        return host

    def set_link(self, host: str, up: bool) -> None:
        """Cut (`up=False`) or restore `host`'s link to the bridge."""
        _ip("link", "set", self.hosts[host].veth, "up" if up else "down")

    def limit_rate(
        self, host: str, rate: str | None, *, burst: str = "256kbit", latency: str = "50ms"
    ) -> None:
        """Limit what `host` sends and receives to `rate` (e.g. "100mbit", `tc`'s token bucket
        filter, `burst` and `latency` as `tc-tbf` takes them, on both ends of its link); None
        removes the limit."""
        target = self.hosts[host]
        pairs = ((None, target.veth), (target.netns, "eth0"))
        for netns, device in pairs:
            prefix = ["ip", "netns", "exec", netns] if netns else []
            if rate is None:
                subprocess.run(
                    [*prefix, "tc", "qdisc", "del", "dev", device, "root"],
                    capture_output=True, timeout=30, check=False,
                )  # fmt: skip
            else:
                subprocess.run(
                    [*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                     "rate", rate, "burst", burst, "latency", latency],
                    capture_output=True, text=True, timeout=30, check=True,
                )  # fmt: skip

    def stop_processes(self, host: str, *, keep_sshd: bool = True) -> list[str]:
        """Stop every process on `host` by pid (SIGTERM, SIGKILL after 5 s); returns what was
        running (its sshd is kept unless `keep_sshd` is False)."""
        keep = {self.sshd_pids.get(host)} if keep_sshd else set()
        pids = [pid for pid in self.pids(host) if pid not in keep]
        seen = self.processes(host) if pids else []
        _stop_pids(pids)
        return seen

    def stop_sshd(self, host: str) -> None:
        """Stop `host`'s sshd by pid (its sessions' processes stay)."""
        _stop_pids([self.sshd_pids[host]])

    def start_sshd(self, host: str) -> None:
        """Start `host`'s sshd again (after `stop_sshd`) and wait until it listens."""
        self._start_sshd(self.hosts[host])
        self._wait_for_sshd(self.hosts[host])

    # -- making and removing -----------------------------------------------------------------
    def up(self) -> HostCluster:
        """Make the bridge, the namespaces, their hosts files, keys and sshds.

        On any failure what was made is removed again, and the error propagates.
        """
        try:
            self._make_network()
            self._make_keys()
            for host in self.hosts.values():
                self._start_sshd(host)
            for host in self.hosts.values():
                self._wait_for_sshd(host)
            self.save()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process in the namespaces by pid, remove the namespaces, the bridge and
        the `/etc/netns` folders. Safe to call twice, and on a half-made cluster."""
        problems = []
        for host in self.hosts.values():
            try:
                _stop_pids(self.pids(host.name))
            except Exception as error:  # keep removing the rest
                problems.append(f"{host.name}: {error}")
            for argv in (["netns", "del", host.netns], ["link", "del", host.veth]):
                subprocess.run(["ip", *argv], capture_output=True, timeout=30, check=False)
            shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)
        subprocess.run(
            ["ip", "link", "del", self.bridge], capture_output=True, timeout=30, check=False
        )
        shutil.rmtree(self.folder, ignore_errors=True)
        left = [h.netns for h in self.hosts.values() if h.netns in _namespaces()]
        if left or problems:
            raise HostSetupError(f"could not remove namespace hosts {left}: {problems}")

    def save(self) -> Path:
        """Write `state.json` (what `down` needs) into the cluster's folder."""
        path = self.folder / "state.json"
        path.write_text(
            json.dumps(
                {
                    "token": self.token,
                    "engine_hosts": len(self.engine_hosts),
                    "hosts": {n: dataclasses.asdict(h) for n, h in self.hosts.items()},
                    "sshd_pids": self.sshd_pids,
                    "outsiders": sorted(self.outsiders),
                    "ssh_config": str(self.ssh_config),
                    "from_shell": self.from_shell,
                },
                indent=1,
            )
        )
        return path

    @classmethod
    def load(cls, folder: Path) -> HostCluster:
        """The cluster described by `folder/state.json` (made by `up`, maybe elsewhere)."""
        data = json.loads((Path(folder) / "state.json").read_text())
        cluster = cls(int(data["engine_hosts"]), folder=Path(folder), token=data["token"])
        cluster.sshd_pids = {k: int(v) for k, v in data["sshd_pids"].items()}
        cluster.from_shell = bool(data.get("from_shell"))
        for name in data.get("outsiders", []):
            cluster.hosts[name] = Host(**data["hosts"][name])
            cluster.outsiders.add(name)
        return cluster

    def _make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _no_ipv6(None, self.bridge)
        _ip("link", "set", self.bridge, "up")
        others = [f"{h.address} {h.name}" for h in self.hosts.values()]
        for host in self.hosts.values():
            self._add_host(host, others)

    def _add_host(self, host: Host, others: list[str]) -> None:
        """Its namespace, its veth on the bridge, its address and its /etc/netns files."""
        # as on Debian, a host's own name resolves to 127.0.1.1 there (Note [Own name])
        lines = ["127.0.0.1 localhost", f"127.0.1.1 {host.name}", *others]
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns",
            host.netns)  # fmt: skip
        _no_ipv6(None, host.veth)
        _no_ipv6(host.netns, "all")
        _no_ipv6(host.netns, "default")
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev",
            "eth0")  # fmt: skip
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        etc = Path("/etc/netns") / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        (etc / "hostname").write_text(host.name + "\n")

    def _make_keys(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"nbdist-{self.token}",
                 "-f", str(self.folder / name)],
                check=True, timeout=30, capture_output=True,
            )  # fmt: skip
        (self.folder / "authorized_keys").write_text(
            (self.folder / "client_key.pub").read_text()
        )
        self.ssh_config.write_text(
            "Host *\n"
            f"  IdentityFile {self.client_key}\n"
            "  IdentitiesOnly yes\n"
            "  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n"
            "  BatchMode yes\n"
            "  LogLevel ERROR\n"
        )
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory

    def _start_sshd(self, host: Host) -> None:
        config = self.folder / f"sshd_config.{host.name}"
        config.write_text(
            "\n".join(
                [
                    "Port 22",
                    f"ListenAddress {host.address}",
                    f"HostKey {self.folder / 'host_key'}",
                    f"AuthorizedKeysFile {self.folder / 'authorized_keys'}",
                    f"PidFile {self.folder / f'sshd.{host.name}.pid'}",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        log = open(self.folder / f"sshd.{host.name}.log", "w")  # noqa: SIM115 - sshd's output
        with log:
            process = self.popen(
                host.name,
                [str(_sshd()), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # ip, unshare and sh each exec the next: the pid is sshd's
        self.sshd_pids[host.name] = process.pid
        self.save_partial()

    def save_partial(self) -> None:
        with contextlib.suppress(OSError):
            self.save()

    def _wait_for_sshd(self, host: Host) -> None:
        deadline = time.monotonic() + _SSHD_READY_S
        while time.monotonic() < deadline:
            if any(port == 22 for _, port, _ in self.listening(host.name)):
                return
            if not Path(f"/proc/{self.sshd_pids[host.name]}").exists():
                break
            time.sleep(_POLL_S)  # polling for the listener (bounded by the deadline)
        log = (self.folder / f"sshd.{host.name}.log").read_text(errors="replace")
        raise HostSetupError(f"sshd on {host.name} did not listen within {_SSHD_READY_S} s: {log}")


@contextlib.contextmanager
def host_cluster(n: int = 2) -> Iterator[HostCluster]:
    """A `HostCluster` of `n` engine hosts and the notebook's host, removed on exit.

    Raises:
        HostSetupError: `skip_reason()` is not None (its text says why), or a part would not
            start (its output is in the message).
    """
    with brought_up(skip_reason(), lambda: HostCluster(n).up()) as cluster:
        yield cluster


_Closable = TypeVar("_Closable")


@contextlib.contextmanager
def brought_up(reason: str | None, start: Callable[[], _Closable]) -> Iterator[_Closable]:
    """What `start()` brings up (a `HostCluster`, a `SlurmCluster`: something with `close()`),
    closed on exit; `HostSetupError(reason)` instead when `reason` (a `skip_reason()`) is set.

    Example (makes network namespaces, so not run here)::

        with brought_up(skip_reason(), lambda: HostCluster(2).up()) as hosts:
            ...
    """
    if reason:
        raise HostSetupError(reason)
    thing = start()
    try:
        yield thing
    finally:
        thing.close()


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise HostSetupError(f"`ip {' '.join(argv)}` failed: {done.stderr.strip()}")


def _no_ipv6(netns: str | None, device: str) -> None:
    """Turn IPv6 off on `device` (no link-local fe80:: addresses: the hosts use 198.18.0.0/15
    only)."""
    setting = f"/proc/sys/net/ipv6/conf/{device}/disable_ipv6"
    if netns is None:
        with contextlib.suppress(OSError):
            Path(setting).write_text("1")
        return
    subprocess.run(
        ["ip", "netns", "exec", netns, "sh", "-c", f"test ! -e {setting} || echo 1 > {setting}"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip


def _namespaces() -> set[str]:
    done = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False
    )
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def _sshd() -> str | None:
    found = shutil.which("sshd") or "/usr/sbin/sshd"
    return found if os.path.exists(found) else None


def alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (a stopped process whose parent has
    not reaped it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _stop_pids(pids: Sequence[int], grace: float = _STOP_GRACE_S) -> None:
    """SIGTERM each pid, SIGKILL those alive after `grace` seconds; wait until all are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_POLL_S)  # waiting for exits (bounded by the deadline)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for pid in pids:  # reap our own children (the sshds started by this process)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def main(argv: Sequence[str] | None = None) -> int:
    """`up N` | `down [FOLDER...]` | `run HOST -- CMD...` | `list`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nbdist.testing.hosts", description=__doc__
                                     .split("\n\n")[0])  # fmt: skip
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="make nb and N engine hosts (h1..hN)")
    up.add_argument("n", type=int, nargs="?", default=2)
    down = sub.add_parser("down", help="remove the named clusters (default: all made by `up`)")
    down.add_argument("folders", nargs="*")
    run = sub.add_parser("run", help="run a command on a host of the newest cluster")
    run.add_argument("host")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("list", help="list clusters made by `up`")
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    states = sorted(STATE_ROOT.glob("*/state.json"), key=lambda p: p.stat().st_mtime)
    if args.action == "up":
        cluster = HostCluster(args.n)
        cluster.from_shell = True
        cluster.up()
        print(f"state: {cluster.folder}")
        for host in cluster.hosts.values():
            print(f"{host.name:4} {host.address:14} netns {host.netns}  veth {host.veth}")
        print(f"ssh: ssh -F {cluster.ssh_config} h1 hostname   (run it on nb: `run nb -- ...`)")
        return 0
    if args.action == "list":
        for state in states:
            print(state.parent)
        return 0
    if args.action == "down":
        # a bare `down` removes the clusters `up` made, never one a test run is using
        folders = [Path(f) for f in args.folders] or [
            state.parent for state in states if HostCluster.load(state.parent).from_shell
        ]
        for folder in folders:
            HostCluster.load(folder).close()
            print(f"removed {folder}")
        return 0
    mine = [state for state in states if HostCluster.load(state.parent).from_shell]
    if not mine:
        print("no cluster: run `up` first", file=sys.stderr)
        return 2
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    cluster = HostCluster.load(mine[-1].parent)
    return subprocess.run(cluster.command(args.host, command), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
