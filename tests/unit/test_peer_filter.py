"""The store's peer filter (Note [Store peers]) on real loopback sockets."""

from __future__ import annotations

import socket
import sys

import pytest

from nbdist.collectives.peer_filter import attach, program
from nbdist.errors import InvalidArgumentError

DROPPED_AFTER_S = 1.0


def connect_from(source: str, port: int) -> str:
    probe = socket.socket()
    probe.settimeout(DROPPED_AFTER_S)
    try:
        probe.bind((source, 0))
        probe.connect(("127.0.0.5", port))
    except TimeoutError:
        return "dropped"
    finally:
        probe.close()
    return "accepted"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
def test_only_the_peers_and_loopback_reach_a_filtered_listener():
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.5", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert connect_from("127.0.0.3", port) == "accepted"  # before: anyone
        assert attach(listener, ["127.0.0.2"])
        assert connect_from("127.0.0.2", port) == "accepted"
        assert connect_from("127.0.0.1", port) == "accepted"
        assert connect_from("127.0.0.3", port) == "dropped"
    finally:
        listener.close()


def test_too_many_peers_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="at most 250 addresses"):
        program([f"10.0.{i // 250}.{i % 250 + 1}" for i in range(300)])
