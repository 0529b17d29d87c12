"""A machine on the cluster's network that is not in the cluster gets nothing from it.

Besides nb, h1 and h2, one more namespace, `x`, sits on the same bridge (an address in the same
subnet, every host's name resolves there) but is not in the cluster. From `x`, with real sockets:

- the rendezvous store (torch's `TCPStore`, on h1) does not answer: its listening socket drops
  every segment whose source is not one of the cluster's machines (Note [Store peers] in
  `nbdist.collectives.peer_filter`), while h2 connects to it;
- requests to the controller (on nb) run nothing unless signed with the cluster's key: one with
  a wrong key and one unsigned are dropped, while one signed with the key (which x would not
  have; it shows that the port is reachable, so the signature is what protects it) runs;
- whatever else listens on h1 and h2 (gloo's listener, the engines' stack servers) is left
  alone after a connection that sends garbage: the cluster still all-reduces and trains.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster

from .test_engines_across_hosts import START_S, TRAIN, start_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]  # a start over ssh: up to 240 s

DROPPED_AFTER_S = 3.0
"""How long the outsider waits for the store to answer a connection (a SYN that is dropped
gets no answer at all; one that is let in gets it within milliseconds)."""

PROBE = r"""
import json, os, socket, sys, time
ports = json.loads(sys.argv[1])
out = {}
for address, port in ports:
    probe = socket.socket()
    probe.settimeout(float(sys.argv[2]))
    began = time.monotonic()
    try:
        probe.connect((address, port))
    except socket.timeout:
        out[f"{address}:{port}"] = "dropped"
    except ConnectionRefusedError:
        out[f"{address}:{port}"] = "refused"
    else:
        try:
            probe.sendall(os.urandom(256))  # garbage: not what the listener expects
        except OSError:
            pass
        out[f"{address}:{port}"] = "accepted"
    finally:
        probe.close()
print(json.dumps(out))
"""

FORGE = r"""
import json, sys, uuid, zmq
from jupyter_client.session import Session
info, marks = json.loads(sys.argv[1]), json.loads(sys.argv[2])
context = zmq.Context()
sock = context.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(f"{info['interface']}:{info['task']}")
scheme = info["signature_scheme"]
sessions = {
    "wrong": Session(key=uuid.uuid4().hex.encode(), signature_scheme=scheme),
    "unsigned": Session(key=b"", signature_scheme=scheme),
    "right": Session(key=info["key"].encode(), signature_scheme=scheme),
}
for name, session in sessions.items():
    code = f"open({marks[name]!r}, 'w').close()"
    content = {"code": code, "silent": False, "user_expressions": {}}
    session.send(sock, "execute_request", content=content)
replies = []
while sock.poll(60_000 if not replies else 2_000):
    _, reply = sessions["right"].recv(sock, mode=0)
    replies.append(reply["header"]["msg_type"])
print(json.dumps(replies))
sock.close()
context.term()
"""


@pytest.fixture(scope="module")
def kernel(hosts: HostCluster, tmp_path_factory) -> Iterator[HostKernel]:
    folder = tmp_path_factory.mktemp("outsider")
    hosts.add_outsider("x")
    with HostKernel(hosts, env={"IPYTHONDIR": str(folder / "ipython")}) as k:
        k.execute("%load_ext nbdist")
        k.execute("import time, torch, nbdist as nd")
        k.execute(start_line(hosts, folder).replace(":2", ":1"), timeout=START_S + 60)
        k.folder = folder  # type: ignore[attr-defined]
        try:
            yield k
        finally:
            k.execute("%dist stop", timeout=120, allow_error=True)


def run_python(hosts: HostCluster, host: str, script: str, *args: str) -> object:
    done = hosts.run(host, [sys.executable, "-c", script, *args], timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def all_reduce_sum(kernel: HostKernel) -> list[str]:
    reply = kernel.execute(
        "%%distribute\nimport torch.distributed as dist\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
    )
    return re.findall(r"sum [0-9.]+", reply["stdout"])


def test_the_store_drops_an_outsider_and_lets_a_cluster_host_in(
    hosts: HostCluster, kernel: HostKernel
):
    reply = kernel.execute(
        "%%distribute --target 0\nimport os\nprint(os.environ['MASTER_ADDR'], "
        "os.environ['MASTER_PORT'])"
    )
    address, port = reply["stdout"].split()[-2:]
    assert address == hosts.hosts["h1"].address, reply["stdout"]
    store = json.dumps([[address, int(port)]])
    outside = run_python(hosts, "x", PROBE, store, str(DROPPED_AFTER_S))
    inside = run_python(hosts, "h2", PROBE, store, str(DROPPED_AFTER_S))
    print(f"\nstore {address}:{port}: from x {outside}, from h2 {inside}")
    assert outside == {f"{address}:{port}": "dropped"}
    assert inside == {f"{address}:{port}": "accepted"}
    assert all_reduce_sum(kernel) == ["sum 2.0", "sum 2.0"]


def test_the_controller_runs_nothing_an_outsider_sends_unsigned(
    hosts: HostCluster, kernel: HostKernel, tmp_path: Path
):
    files = list(Path(kernel.folder).glob("ipython/profile_*/security/*-client.json"))
    assert len(files) == 1, files
    info = json.loads(files[0].read_text())
    assert info["interface"] == f"tcp://{hosts.notebook.address}", info["interface"]
    marks = {name: str(tmp_path / name) for name in ("wrong", "unsigned", "right")}
    replies = run_python(hosts, "x", FORGE, json.dumps(info), json.dumps(marks))
    # every engine has handled what was sent before this round trip
    kernel.execute("%%distribute\npass")
    ran = {name for name, path in marks.items() if Path(path).exists()}
    print(f"\nreplies to x: {replies}; ran: {sorted(ran)}")
    assert ran == {"right"}, ran
    assert replies == ["execute_reply"], replies


def test_other_ports_ignore_an_outsider_and_training_goes_on(
    hosts: HostCluster, kernel: HostKernel
):
    ports = sorted(
        [host.address, port]
        for host in hosts.engine_hosts
        for address, port, _ in hosts.listening(host.name)
        if address == host.address and port != 22
    )
    assert len(ports) >= 3, ports  # the store, gloo's listener on each host, ...
    seen = run_python(hosts, "x", PROBE, json.dumps(ports), str(DROPPED_AFTER_S))
    print(f"\nfrom x: {seen}")
    assert all(outcome in ("dropped", "refused", "accepted") for outcome in seen.values())
    assert all_reduce_sum(kernel) == ["sum 2.0", "sum 2.0"]
    result = kernel.execute(TRAIN, timeout=300)["result"]
    digests = re.findall(r"'([0-9a-f]{64})'", result)
    assert len(digests) == 2 and len(set(digests)) == 1, result
