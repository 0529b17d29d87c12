"""A host whose link is limited to 100 Mbit/s (`tc`'s token bucket filter with the issue's
settings on both ends of its link, inside the test's namespaces): training gives the same
parameters as without the limit, bit-identical on every replica, and the dashboard's straggler
and its reductions caption name that host's replicas (a slow link, Note [Slow links] in
`nbdist.cluster.links`).

The kernel runs on `nb`; 4 engines on h1 and h2 (2 each) train one model. The dashboard's
numbers are read from its data (`source_for().collect()`, what every view draws from) and its
reductions view's caption, not from pixels.

"Who waited for whom" alone cannot name them: it charges each wait to the replica that arrived
last, and with two engine hosts every all-reduce crosses h2's link both ways, so the limit slows
every replica's collective alike (measured: its straggler was replica 1, on h1). The dashboard
tells the hosts apart by each engine's rate to the notebook, measured on an explicit refresh.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster

from .test_engines_across_hosts import START_S, TRAIN, start_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]  # a start over ssh: up to 240 s

RATE = ("100mbit", "32kbit", "400ms")
"""The issue's limit: `tc qdisc add dev ... root tbf rate 100mbit burst 32kbit latency 400ms`."""


@pytest.fixture(scope="module")
def kernel(hosts: HostCluster, tmp_path_factory) -> Iterator[HostKernel]:
    folder = tmp_path_factory.mktemp("slow")
    with HostKernel(hosts, env={"IPYTHONDIR": str(folder / "ipython")}) as k:
        k.execute("%load_ext nbdist")
        k.execute("import time, torch, nbdist as nd")
        k.execute(start_line(hosts, folder), timeout=START_S + 60)
        try:
            yield k
        finally:
            k.execute("%dist stop", timeout=120, allow_error=True)


def train(kernel: HostKernel) -> list[str]:
    """Train on the 4 replicas; the parameters' digests, one per replica."""
    result = kernel.execute(TRAIN, timeout=300)["result"]
    digests = re.findall(r"'([0-9a-f]{64})'", result)
    assert len(digests) == 4, result
    return digests


DASHBOARD = """
from nbdist.widgets._data import source_for
from nbdist.widgets.reductions import ReductionsView
from nbdist.telemetry.timeline import blame
_data = source_for().collect()
_view = ReductionsView()
_view.update(_data)
_recent = [r for r in _data.collectives if r.start >= _since]
dict(blame=blame(_recent), hosts={row.replica: row.host for row in _data.engines},
     caption=_view.summary.splitlines()[0], straggler=_view.straggler,
     slow_link=_view.slow_link, rates=_data.link_rates)
"""


def dashboard(kernel: HostKernel, since: float) -> dict:
    """What the dashboard's data and its reductions view say about the collectives since
    `since` (an explicit refresh: it measures each engine's link to the notebook)."""
    reply = kernel.execute(f"_since = {since!r}\n" + DASHBOARD, timeout=120)
    return ast.literal_eval(reply["result"])


def test_a_100_mbit_host_trains_the_same_and_its_replicas_are_named(
    hosts: HostCluster, kernel: HostKernel
):
    fast = train(kernel)
    began = float(kernel.execute("time.time()")["result"])
    unlimited = dashboard(kernel, began - 1e9)
    hosts.limit_rate("h2", RATE[0], burst=RATE[1], latency=RATE[2])
    try:
        shown = subprocess.run(
            ["tc", "qdisc", "show", "dev", hosts.hosts["h2"].veth],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in shown and "100Mbit" in shown, shown
        slow = train(kernel)
        limited = dashboard(kernel, began)
    finally:
        hosts.limit_rate("h2", None)
    for name, seen in (("unlimited", unlimited), ("h2 at 100 Mbit/s", limited)):
        rates = {r: round(v / 1e6, 1) for r, v in seen["rates"].items()}
        print(f"\n{name}: blame {seen['blame']}, MB/s to nb {rates}\n  {seen['caption']}")
    assert len(set(fast)) == 1, fast  # bit-identical on every replica
    assert slow == fast  # and the same as without the limit
    assert limited["hosts"] == {0: "h1", 1: "h1", 2: "h2", 3: "h2"}, limited["hosts"]
    # h2's replicas are named, by host, and only while its link is limited
    assert unlimited["slow_link"] == [], unlimited
    assert limited["slow_link"] == [2, 3], limited
    assert "slow link: replicas 2, 3 on h2" in limited["caption"], limited["caption"]
    # the straggler by "who waited for whom" is named with its host (replicas on two hosts)
    late = limited["straggler"]
    named = f"straggler: replica {late} on {limited['hosts'][late]}" if late is not None else (
        "straggler: none"
    )
    assert named in limited["caption"], limited["caption"]
