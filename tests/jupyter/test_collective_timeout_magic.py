"""`%dist start --collective-timeout S`: the engines' collectives wait S seconds for a late
engine (not 300 s), `%dist status` shows it, and bad values are refused with the fix."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from nbdist.magics import DistMagics, current_cluster
from nbdist.testing import assert_processes_gone

pytestmark = pytest.mark.cluster

LATE = r"""
import time
began = time.monotonic()
if strategy.cluster_resolver.task_id == 1:
    time.sleep(8)  # alive, but late for the collective
try:
    strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(1)))
    outcome = "completed"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"
(outcome, round(time.monotonic() - began, 1))
"""


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", r"--collective-timeout must be a positive number of seconds, got 0; e\.g\. "
              r"`%dist start -n 2 --collective-timeout 600`"),
        ("-5", r"must be a positive number of seconds, got -5"),
        ("nan", r"must be a positive number of seconds, got nan"),
        ("soon", r"argument --collective-timeout: invalid float value: 'soon'"),
    ],
)  # fmt: skip
def test_bad_collective_timeouts_are_refused_with_the_fix(ipython, value, message):
    magics = DistMagics(ipython)
    with pytest.raises(UsageError, match=message):
        magics.dist(f"start -n 2 --collective-timeout {value}")
    assert magics.cluster is None


def test_collective_timeout_reaches_the_engines_and_status_shows_it(ipython, capsys):
    try:
        ipython.run_line_magic("dist", "start -n 2 --timeout 90 --collective-timeout 3")
        capsys.readouterr()
        ipython.run_line_magic("dist", "status")
        status = capsys.readouterr().out
        assert "backend auto, collective timeout 3 s, running" in status, status
        results = ipython.run_cell_magic("distribute", "--timeout 60", LATE).values
        outcome, waited = results[0]
        assert outcome.startswith("CollectiveTimeoutError"), outcome
        assert "rank 1 never called this collective" in outcome, outcome
        assert waited < 8, waited  # failed before replica 1 came; 300 s would have waited
    finally:
        cluster = current_cluster()
        pids = cluster.processes if cluster is not None and cluster.running else ()
        ipython.run_line_magic("dist", "stop")
        assert_processes_gone(pids)
