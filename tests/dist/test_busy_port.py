"""A rendezvous port that another process holds: rank 0 says so at once, naming the port."""

from __future__ import annotations

import socket
import time

import pytest

import nbdist as nd
from nbdist.cluster_resolver import TorchrunClusterResolver
from nbdist.errors import RendezvousError


def test_rank_0_on_a_busy_port_names_it_and_the_fix():
    with socket.socket() as holder:  # another program listening on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        begin = time.monotonic()
        with pytest.raises(RendezvousError) as info:
            nd.MultiWorkerMirroredStrategy(TorchrunClusterResolver(environ=env))
        assert time.monotonic() - begin < 10  # at once, not after the rendezvous timeout
    message = str(info.value)
    assert f"Port {port} on 127.0.0.1 is already in use" in message
    assert "MASTER_PORT" in message  # the fix: another port
