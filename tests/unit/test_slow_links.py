"""Stragglers across hosts on the dashboard: the straggler named with its host, and the replicas
of a host whose link to the notebook is slow (Note [Slow links] in `nbdist.cluster.links`)."""

from __future__ import annotations

from nbdist.telemetry.records import CollectiveRecord
from nbdist.telemetry.timeline import slow_links
from nbdist.widgets._data import DashboardData, EngineRow
from nbdist.widgets.reductions import ReductionsView

RECORD = CollectiveRecord("all_reduce:SUM", 8, "gloo", (0, 1, 2), 0.0, 0.1, (0.05, 0.05, 0.0))
HOSTS = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}


def rows(hosts: dict[int, str]) -> list[EngineRow]:
    return [EngineRow(r, "alive", host, 1, "cpu") for r, host in hosts.items()]


def test_the_straggler_is_named_with_its_host_when_replicas_span_hosts():
    view = ReductionsView()
    view.update(DashboardData(engines=rows({0: "h1", 1: "h1", 2: "h2"}), collectives=[RECORD]))
    assert "straggler: replica 2 on h2" in view.caption.value
    assert view.summary.splitlines()[0] == "1 collectives · straggler: replica 2 on h2"
    alone = ReductionsView()  # one host: its name would say nothing
    alone.update(DashboardData(engines=rows({0: "h1", 1: "h1", 2: "h1"}), collectives=[RECORD]))
    assert alone.summary.splitlines()[0] == "1 collectives · straggler: replica 2"


def test_the_replicas_of_a_host_with_a_slow_link_are_named_with_their_rates():
    rates = {0: 3.1e8, 1: 2.2e8, 2: 1.1e7, 3: 1.2e7}
    assert slow_links(rates, HOSTS) == [2, 3]
    view = ReductionsView()
    view.update(DashboardData(engines=rows(HOSTS), collectives=[RECORD], link_rates=rates))
    assert view.slow_link == [2, 3]
    expected = "slow link: replicas 2, 3 on h2 (12.0 MB/s to the notebook; h1 310.0 MB/s)"
    assert expected in view.summary.splitlines()[0]
    assert expected in view.caption.value
    # a refresh in the dashboard's thread (no measure) keeps what was measured
    view.update(DashboardData(engines=rows(HOSTS), collectives=[RECORD, RECORD]))
    assert view.slow_link == [2, 3] and expected in view.summary


def test_links_within_a_factor_of_3_name_nobody():
    assert slow_links({0: 3e8, 1: 3e8, 2: 1.1e8, 3: 1.5e8}, HOSTS) == []
    assert slow_links({0: 3e8, 1: 1e6}, {0: "h1", 1: "h1"}) == []  # one host: nothing to compare
    view = ReductionsView()
    view.update(DashboardData(engines=rows(HOSTS), collectives=[RECORD],
                              link_rates={0: 3e8, 1: 3e8, 2: 1.1e8, 3: 1.5e8}))  # fmt: skip
    assert view.slow_link == [] and "slow link" not in view.summary
