"""The store's peer filter (Note [Store peers]) on real loopback sockets, and the straggler
named with its host when the replicas run on several hosts."""

from __future__ import annotations

import socket
import sys

import pytest

from nbdist.collectives.peer_filter import attach, program
from nbdist.errors import InvalidArgumentError
from nbdist.telemetry.records import CollectiveRecord
from nbdist.widgets._data import DashboardData, EngineRow
from nbdist.widgets.reductions import ReductionsView

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


def test_the_straggler_is_named_with_its_host_when_replicas_span_hosts():
    record = CollectiveRecord("all_reduce:SUM", 8, "gloo", (0, 1, 2), 0.0, 0.1, (0.05, 0.05, 0.0))
    rows = [EngineRow(r, "alive", host, 1, "cpu") for r, host in ((0, "h1"), (1, "h1"), (2, "h2"))]
    view = ReductionsView()
    view.update(DashboardData(engines=rows, collectives=[record]))
    assert "straggler: replica 2 on h2" in view.caption.value
    assert view.summary.splitlines()[0] == "1 collectives · straggler: replica 2 on h2"
    alone = ReductionsView()  # one host: its name would say nothing
    same = [EngineRow(r, "alive", "h1", 1, "cpu") for r in range(3)]
    alone.update(DashboardData(engines=same, collectives=[record]))
    assert alone.summary.splitlines()[0] == "1 collectives · straggler: replica 2"
