"""Engines on two namespace hosts, started over ssh from a real kernel on the notebook's host.

The kernel runs on `nb` (its own network stack); `%dist start --launcher ssh --hosts h1:2,h2:2`
starts 4 engines on h1 and h2, which reach `nb` and each other only through the bridge. Each
host's own name resolves to 127.0.1.1 there, as on Debian (Note [Own name] in
`nbdist.testing.hosts`), so gloo must be given the right interface. The tests share the cluster
and run in order: start and status, listening sockets, `%%distribute` and `strategy.run`, a host
cut off in the middle of an all-reduce, restart, stop.
"""

from __future__ import annotations

import ast
import ipaddress
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]  # a start over ssh: up to 240 s

START_S = 240.0
LOST_WITHIN_S = 10.0
"""The issue's bound: replicas on other hosts get a named error within 10 s of a cut link."""
SLACK_S = 3.0
"""What a loaded 2-core machine may add to that (the kernel's reply travelling back)."""
HOSTS = "h1:2,h2:2"


def start_line(hosts: HostCluster, folder: Path) -> str:
    return f"%dist start {hosts.dist_start_options(HOSTS, folder, START_S)}"


@pytest.fixture(scope="module")
def kernel(hosts: HostCluster, tmp_path_factory) -> Iterator[HostKernel]:
    folder = tmp_path_factory.mktemp("across")
    with HostKernel(hosts, env={"IPYTHONDIR": str(folder / "ipython")}) as k:
        k.execute("%load_ext nbdist")
        k.execute("import os, socket, time, torch, nbdist as nd\n"
                  "from nbdist.magics.core import current_cluster")  # fmt: skip
        k.folder = folder  # type: ignore[attr-defined]
        try:
            yield k
        finally:
            k.execute("%dist stop", timeout=120, allow_error=True)


def engine_hosts(kernel: HostKernel) -> list[str]:
    reply = kernel.execute("[row.host for row in current_cluster().status()]")
    return ast.literal_eval(reply["result"])  # a list of names, as printed by the kernel


def test_start_over_ssh_names_each_engines_host(hosts: HostCluster, kernel: HostKernel):
    began = time.monotonic()
    reply = kernel.execute(start_line(hosts, kernel.folder), timeout=START_S + 60)
    print(f"\n%dist start on 2 hosts: {time.monotonic() - began:.1f} s\n{reply['stdout']}")
    assert engine_hosts(kernel) == ["h1", "h1", "h2", "h2"]
    status = kernel.execute("%dist status")["stdout"]
    assert status.count("h1") >= 2 and status.count("h2") >= 2, status
    # the engines run on their hosts, not on the notebook's
    for name in ("h1", "h2"):
        assert len([p for p in hosts.processes(name) if "_engine_main" in p]) == 2


def test_nothing_listens_on_every_interface(hosts: HostCluster, kernel: HostKernel):
    seen = {}
    for host in hosts.hosts.values():
        sockets = hosts.listening(host.name)
        seen[host.name] = sockets
        for address, port, program in sockets:
            ip = ipaddress.ip_address(address.split("%")[0]) if address != "*" else None
            assert ip is not None and not ip.is_unspecified, (host.name, address, port, program)
            assert ip.is_loopback or address == host.address, (host.name, address, port, program)
    # the controller (on nb) and the store and gloo (on the engine hosts) listen on the bridge
    assert any(a == hosts.notebook.address and p != 22 for a, p, _ in seen["nb"])
    for name in ("h1", "h2"):
        assert any(a == hosts.hosts[name].address and p != 22 for a, p, _ in seen[name])


def test_distribute_and_strategy_run_all_reduce_across_hosts(kernel: HostKernel):
    reply = kernel.execute(
        "%%distribute\n"
        "import socket, torch.distributed as dist\n"
        "t = torch.tensor([10.0 * (dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item(), socket.gethostname())\n"
    )
    lines = sorted(line for line in reply["stdout"].splitlines() if "sum" in line)
    assert len(lines) == 4 and all("sum 100.0" in line for line in lines), reply["stdout"]
    assert sum("h1" in line for line in lines) == 2 and sum("h2" in line for line in lines) == 2
    reply = kernel.execute(
        "def replica_sum():\n"
        "    ctx = nd.get_replica_context()\n"
        "    return ctx.all_reduce('sum', torch.tensor(1.0 + ctx.replica_id_in_sync_group))\n"
        "[float(v) for v in current_cluster().strategy.run(replica_sum).values]"
    )
    assert reply["result"] == "[10.0, 10.0, 10.0, 10.0]"


TRAIN = """%%distribute
import hashlib, os, time
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 256)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

def step(x, y):
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()

g = torch.Generator().manual_seed(int(os.environ["RANK"]))
began = time.perf_counter()
for i in range(8):
    x = torch.randn(32, 256, generator=g)
    strategy.run(step, args=(x, x.flip(1)))
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
(hashlib.sha256(weights).hexdigest(), round(time.perf_counter() - began, 2))
"""


def train(kernel: HostKernel) -> tuple[set[str], list[float]]:
    """Train on the 4 replicas; the parameters' digests (one per replica) and their times."""
    result = kernel.execute(TRAIN, timeout=300)["result"]
    pairs = re.findall(r"\('([0-9a-f]{64})', ([0-9.]+)\)", result)
    assert len(pairs) == 4, result
    return [digest for digest, _ in pairs], [float(seconds) for _, seconds in pairs]


def test_training_on_a_100_mbit_link_gives_the_same_parameters(
    hosts: HostCluster, kernel: HostKernel
):
    fast, fast_s = train(kernel)
    hosts.limit_rate("h2", "100mbit")
    try:
        shown = subprocess.run(
            ["tc", "qdisc", "show", "dev", hosts.hosts["h2"].veth],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in shown and "100Mbit" in shown, shown
        slow, slow_s = train(kernel)
    finally:
        hosts.limit_rate("h2", None)
    print(f"\n8 steps: {max(fast_s):.2f} s unlimited, {max(slow_s):.2f} s with h2 at 100 Mbit/s")
    assert len(set(fast)) == 1, fast  # bit-identical on every replica
    assert slow == fast  # and the same as without the limit


def test_a_host_cut_off_mid_all_reduce_is_named_within_10_s(
    hosts: HostCluster, kernel: HostKernel, tmp_path: Path
):
    marks = tmp_path / "marks"
    marks.mkdir()
    kernel.send(
        "%%distribute\n"
        "import pathlib, torch.distributed as dist\n"
        "t = torch.ones(1)\n"
        "for step in range(10**7):\n"
        "    dist.all_reduce(t)\n"
        "    t.fill_(1.0)\n"
        "    if step == 20:\n"
        f"        pathlib.Path('{marks}', str(dist.get_rank())).touch()\n",
        timeout=120,
    )
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < 4:
        assert time.monotonic() < deadline, "the replicas never got going"
        time.sleep(0.1)  # polling for the marks (bounded by the deadline)
    hosts.set_link("h2", up=False)
    cut = time.monotonic()
    try:
        reply = kernel.receive(timeout=150)
        seen_after = time.monotonic() - cut
    finally:
        hosts.set_link("h2", up=True)
    text = reply["stdout"] + reply["stderr"] + str(reply["error"])
    print(f"\nerror {seen_after:.1f} s after the cut:\n{text}")
    assert reply["error"] is not None
    assert "HostUnreachableError" in text and "h2" in text and "[2, 3]" in text, text
    assert "stopped sending heartbeats" in text
    assert "EngineTimeoutError" not in text
    assert seen_after < LOST_WITHIN_S + SLACK_S, f"named only after {seen_after:.1f} s"
    # the notebook stays responsive, and the cluster is marked unusable, naming the fix
    refused = kernel.execute("%%distribute\nprint('never')", timeout=60, allow_error=True)
    refused_text = str(refused["error"]) + refused["stderr"]
    assert "ClusterUnusableError" in refused_text and "%dist restart" in refused_text, refused


def assert_quiet(reply: dict) -> None:
    """A stop printed no traceback (ipyparallel's remote kill of an engine already gone did)."""
    text = reply["stdout"] + reply["stderr"]
    assert "Traceback" not in text and "ProcessLookupError" not in text, text


def test_restart_once_the_link_is_back(kernel: HostKernel):
    assert_quiet(kernel.execute("%dist restart", timeout=START_S + 60))
    assert engine_hosts(kernel) == ["h1", "h1", "h2", "h2"]
    reply = kernel.execute(
        "%%distribute\nimport torch.distributed as dist\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
    )
    assert reply["stdout"].count("sum 4.0") == 4, reply["stdout"]


def test_stop_leaves_nothing_on_any_host(hosts: HostCluster, kernel: HostKernel):
    assert_quiet(kernel.execute("%dist stop", timeout=120))
    for name in ("h1", "h2"):
        assert hosts.processes(name) == [], name
    on_nb = hosts.processes("nb")
    assert len(on_nb) == 2 and all("host_kernel" in p or "ipykernel" in p for p in on_nb), on_nb
