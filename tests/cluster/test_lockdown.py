"""A local cluster is locked down by default (issue 12, item 4), with 2 real CPU engines.

- Every socket any process of the cluster listens on (controller and schedulers, engines and
  their nannies, the rendezvous store on engine 0, gloo) is bound to a loopback address. The
  test prints the list (the closing note's table).
- The connection files (with the key that signs messages) and logs are readable by their
  owner only, in folders only the owner can enter.
- A message signed with a wrong key, sent with raw zmq to the controller, is dropped: it never
  runs, while the same message signed with the right key does.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import uuid

import psutil
import pytest
import zmq
from ipyparallel import interactive
from jupyter_client.session import Session

pytestmark = pytest.mark.cluster

REPLY_WAIT_MS = 60_000


@pytest.fixture(scope="module")
def cluster(start_cluster):
    return start_cluster()


def _listening(pids) -> list[tuple[int, str, str, int]]:
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            connections = process.net_connections(kind="inet")
            name = " ".join(process.cmdline()[1:3])
        except psutil.Error:
            continue
        for c in connections:
            listening = c.status == psutil.CONN_LISTEN or (
                c.type == 2 and not c.raddr  # a bound UDP socket
            )
            if listening:
                found.append((pid, name, c.laddr.ip, c.laddr.port))
    return found


def test_every_socket_of_the_cluster_listens_on_loopback_only(cluster):
    pids = cluster.processes
    listening = _listening(pids)
    owners: dict[str, set[str]] = {}  # forked schedulers share their parent's sockets
    for pid, name, ip, port in listening:
        owners.setdefault(f"{ip}:{port}", set()).add(f"{name.split()[-1]} ({pid})")
    print(f"\n{len(owners)} listening addresses of {len(pids)} processes:")
    for address, names in sorted(owners.items(), key=lambda item: sorted(item[1])):
        print(f"  {address:<22} {', '.join(sorted(names))}")
    assert len(listening) >= 10  # controller, schedulers, engines, nannies, store, gloo
    exposed = [s for s in listening if not ipaddress.ip_address(s[2]).is_loopback]
    assert not exposed, f"sockets listening beyond loopback: {exposed}"
    engine0 = cluster.engines[0].pid
    assert any(pid == engine0 for pid, *_ in listening)  # the store and gloo are seen


def _security_files(cluster) -> tuple[str, list[str]]:
    profile = cluster._ipp.profile_dir  # the profile this cluster's ipyparallel uses
    cluster_id = cluster._ipp.cluster_id
    files = []
    for folder in ("security", "log"):
        path = os.path.join(profile, folder)
        files += [os.path.join(path, n) for n in os.listdir(path) if cluster_id in n]
    return profile, files


def test_connection_files_keys_and_logs_are_owner_only(cluster):
    profile, files = _security_files(cluster)
    assert any(f.endswith("-client.json") for f in files)
    assert any(f.endswith(".log") for f in files)
    for folder in ("security", "log"):
        mode = stat.S_IMODE(os.stat(os.path.join(profile, folder)).st_mode)
        assert mode == 0o700, f"{folder}: {oct(mode)}"
    for path in files:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode & 0o077 == 0, f"{path}: {oct(mode)}"


@interactive
def _noop():
    return None


def test_a_message_signed_with_a_wrong_key_is_dropped(cluster, tmp_path):
    _, files = _security_files(cluster)
    with open(next(f for f in files if f.endswith("-client.json"))) as handle:
        info = json.load(handle)
    forged, genuine = tmp_path / "forged", tmp_path / "genuine"
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"{info['interface']}:{info['task']}")
        scheme = info["signature_scheme"]
        wrong = Session(key=uuid.uuid4().hex.encode(), signature_scheme=scheme)
        right = Session(key=info["key"].encode(), signature_scheme=scheme)
        for session, marker in ((wrong, forged), (right, genuine)):
            code = f"open({str(marker)!r}, 'w').close()"
            content = {"code": code, "silent": False, "user_expressions": {}}
            session.send(sock, "execute_request", content=content)
        assert sock.poll(REPLY_WAIT_MS), "the genuine request got no reply"
        _, reply = right.recv(sock, mode=0)
        assert reply["header"]["msg_type"] == "execute_reply"
        assert genuine.exists()
        # Both engines have handled everything sent to them before this round trip, so a
        # forged request that had been accepted would have run by now.
        cluster.client.direct_view([e.id for e in cluster.engines]).apply_sync(_noop)
        assert not forged.exists(), "a request signed with a wrong key was executed"
        assert not sock.poll(0), "the forged request was answered"
    finally:
        sock.close()
        context.term()
