"""The namespace hosts themselves: names, addresses, sshd, isolation and removal.

Each host must look like a machine of its own (its hostname, its address, names that resolve,
no route out of 198.18.0.0/15), be reachable over ssh with the cluster's key only, and leave
nothing behind: no namespace, bridge, veth, `/etc/netns` folder or process (checked by pid).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbdist.testing.hosts import HostCluster, HostSetupError, alive, host_cluster

from .conftest import require_hosts

TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_each_host_has_its_own_name_address_and_sshd(hosts: HostCluster):
    for host in hosts.hosts.values():
        assert hosts.run(host.name, ["hostname"]).stdout.strip() == host.name
        # Python sees the same name, and every host's name resolves to its address
        script = (
            "import socket; print(socket.gethostname(), "
            "*(socket.gethostbyname(n) for n in ('nb', 'h1', 'h2')))"
        )
        said = hosts.run(host.name, [sys.executable, "-c", script]).stdout.split()
        expected = {n: h.address for n, h in hosts.hosts.items()} | {host.name: "127.0.1.1"}
        assert said == [host.name] + [expected[n] for n in ("nb", "h1", "h2")]
        # the only addresses and routes are on the test range (and loopback)
        addresses = hosts.run(host.name, ["ip", "-o", "-4", "addr"]).stdout.split("\n")
        found = {line.split()[3] for line in addresses if line.strip()}
        assert found == {"127.0.0.1/8", f"{host.address}/24"}
        assert hosts.run(host.name, ["ip", "-o", "-6", "addr"]).stdout.strip() == ""
        routes = hosts.run(host.name, ["ip", "-4", "route", "show", "table", "all"]).stdout
        for line in routes.splitlines():
            target = line.split()[1] if line.startswith(("local", "broadcast")) else line.split()[0]
            assert target != "default", routes
            network = ipaddress.ip_network(target, strict=False)
            assert network.subnet_of(TEST_RANGE) or network.is_loopback, routes
        # its sshd listens on its own address only
        assert hosts.listening(host.name) == [(host.address, 22, hosts.listening(host.name)[0][2])]
    # ssh from the notebook's host lands on h2, as h2
    said = hosts.run("nb", ["ssh", *hosts.ssh_args, "h2", "hostname; echo $SSH_CONNECTION"])
    name, connection = said.stdout.strip().splitlines()
    assert name == "h2"
    assert connection.split()[0] == hosts.notebook.address
    assert connection.split()[2] == hosts.hosts["h2"].address


def test_ssh_needs_the_clusters_key(hosts: HostCluster, tmp_path: Path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
               "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
               "-i", str(other)]  # fmt: skip
    done = hosts.run("nb", ["ssh", *options, "h1", "true"], check=False, timeout=30)
    assert done.returncode == 255
    assert "Permission denied" in done.stderr


def test_hosts_are_cut_off_from_each_other_by_their_link(hosts: HostCluster):
    probe = [sys.executable, "-c", "import socket; socket.create_connection(('h1', 22), 3)"]
    hosts.run("nb", probe, timeout=30)
    hosts.set_link("h1", up=False)
    try:
        done = hosts.run("nb", probe, timeout=30, check=False)
        assert done.returncode != 0 and "timed out" in done.stderr
    finally:
        hosts.set_link("h1", up=True)
    hosts.run("nb", probe, timeout=30)


def test_close_stops_every_process_and_removes_the_network():
    require_hosts()
    with host_cluster(1) as cluster:
        names = [h.netns for h in cluster.hosts.values()]
        veths = [h.veth for h in cluster.hosts.values()]
        sleeper = cluster.popen("h1", ["sleep", "600"])
        # `ip netns exec` enters the namespace after it starts: look until it has (bounded)
        deadline = time.monotonic() + 30
        while sleeper.pid not in (on_h1 := cluster.pids("h1")) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the namespace's pids, not synchronising with a process
        assert sleeper.pid in on_h1 and cluster.sshd_pids["h1"] in on_h1
        pids = [pid for host in cluster.hosts for pid in cluster.pids(host)]
        folder = cluster.folder
    sleeper.wait(timeout=10)
    assert sleeper.returncode is not None
    assert not [pid for pid in pids if alive(pid)]
    assert not any(name in _namespaces() for name in names)
    links = _links()
    assert cluster.bridge not in links and not any(veth in links for veth in veths)
    assert not any((Path("/etc/netns") / name).exists() for name in names)
    assert not folder.exists()


def test_a_failed_start_removes_what_it_made():
    require_hosts()
    cluster = HostCluster(1)
    # h1's namespace name is taken: `up` fails there, after making the bridge and nb
    subprocess.run(["ip", "netns", "add", cluster.hosts["h1"].netns], check=True)
    with pytest.raises(HostSetupError, match="netns add"):
        cluster.up()
    assert cluster.hosts["nb"].netns not in _namespaces()
    assert cluster.hosts["h1"].netns not in _namespaces()
    assert cluster.bridge not in _links()


def test_shell_up_run_and_down(tmp_path: Path):
    require_hosts()
    command = [sys.executable, "-m", "nbdist.testing.hosts"]
    up = subprocess.run([*command, "up", "1"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    folder = up.stdout.split()[1]
    try:
        said = subprocess.run(
            [*command, "run", "nb", "--", "ssh", "-F", f"{folder}/ssh_config", "h1", "hostname"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert said.stdout.strip() == "h1", said.stderr
        cluster = HostCluster.load(Path(folder))
        sshds = list(cluster.sshd_pids.values())
        assert all(alive(pid) for pid in sshds)
    finally:
        down = subprocess.run([*command, "down", folder], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in sshds)
    assert cluster.bridge not in _links()
    assert os.path.exists(folder) is False
