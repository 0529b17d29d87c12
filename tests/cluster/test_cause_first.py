"""`cluster.strategy.run` outside a notebook: a failure inside a collective names its cause
first (issue 24, item 2), with 2 real CPU engines.

Replica 1 raises while replica 0 waits for it in nbdist's all-reduce. The message (what a
script or pytest prints) starts with the replica that raised and its error, shows its frames
only, and gives replica 0 one line; `details` keeps every frame of both, nbdist's and gloo's
included.
"""

from __future__ import annotations

import re

import pytest
from ipyparallel import interactive

import nbdist as nd
from nbdist.cluster import RemoteError

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(start_cluster):
    return start_cluster(n=2)


@interactive
def one_fails_while_zero_waits():
    import torch

    ctx = nd.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        raise ZeroDivisionError("replica one divides by zero")
    return ctx.all_reduce("sum", torch.ones(1))


def test_the_message_names_the_cause_first(cluster):
    with pytest.raises(RemoteError) as info:
        cluster.strategy.run(one_fails_while_zero_waits, timeout=60)
    error = info.value
    message = str(error)
    print(message)
    lines = message.splitlines()
    assert len(lines) < 15, len(lines)
    assert lines[0] == (
        "1 of 2 replica(s) failed in strategy.run(one_fails_while_zero_waits): replica(s) [1] "
        "raised ZeroDivisionError."
    )
    assert [f.replica for f in error.causes] == [1]
    assert [f.replica for f in error.consequences] == [0] and error.replicas == (0, 1)
    released = [line for line in lines if line.startswith("replica 0: released")]
    assert len(released) == 1 and re.fullmatch(
        r"replica 0: released from all_reduce:SUM #\d+ because replica 1 failed", released[0]
    ), lines
    assert lines.index(released[0]) > 0
    assert 'raise ZeroDivisionError("replica one divides by zero")' in message
    for internal in ("nbdist/collectives/", "distributed_c10d", "GLHF", "Connection closed",
                     "WorkerLostError"):  # fmt: skip
        assert internal not in message, internal
    # Everything left out is in `details`: replica 0's nbdist frames and gloo's error.
    assert "nbdist/collectives/" in error.details and "WorkerLostError" in error.details
    assert "Connection closed" in error.details
    assert cluster.broken is None and cluster.repaired is not None
    # A later call that succeeds: the repair is history (what `%dist status` shows).
    assert cluster.strategy.run(lambda: 1).values == (1, 1)
    assert cluster.repaired is None
