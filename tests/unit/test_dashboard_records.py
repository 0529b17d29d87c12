"""Telemetry for the dashboard: step records, folding into aggregates, nd.log and nd.progress."""

from __future__ import annotations

import io

import pytest
import torch

import nbdist as nd
from nbdist.telemetry.metrics import metric_log
from nbdist.telemetry.records import HISTOGRAM_BINS, Telemetry

pytestmark = pytest.mark.usefixtures("fresh_metrics")  # tests/unit/conftest.py


def test_run_records_one_step_per_call_with_its_replicas():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    telemetry = strategy.extended.telemetry
    telemetry.clear()
    for _ in range(3):
        strategy.run(lambda: nd.get_replica_context().all_reduce("sum", torch.ones(4)))
    steps = telemetry.steps()
    assert len(steps) == 3
    assert all(s.replicas == (0, 1) and s.duration > 0 for s in steps)
    # The collectives inside fall within their step.
    for step, record in zip(steps, telemetry.records()[-3:]):
        assert step.start <= record.start <= step.start + step.duration


def test_full_log_folds_oldest_records_into_per_op_aggregates():
    t = Telemetry(capacity=100)
    for i in range(1_000_000):
        t.record("all_reduce:SUM", 64, "local", (0, 1), float(i), 1e-4, (0.0, 0.0))
    assert len(t) == 100
    folded = t.aggregates["all_reduce:SUM"]
    assert folded.count == 1_000_000 - 100
    assert folded.nbytes == 64 * folded.count
    assert sum(folded.histogram) == folded.count and len(folded.histogram) == HISTOGRAM_BINS
    assert folded.histogram[6] == folded.count  # 100 µs lies in [64, 128) µs
    snap = t.snapshot()
    assert len(snap["collectives"]) == 100 and snap["aggregates"]["all_reduce:SUM"]["count"]


def test_log_outside_a_strategy_is_replica_zero_and_steps_count_on():
    nd.log(loss=1.0)
    nd.log(loss=0.5, acc=torch.tensor(0.75))
    records = metric_log().records()
    assert [(r[0], r[1], r[2], r[3]) for r in records] == [
        (0, 0, "loss", 1.0),
        (0, 1, "loss", 0.5),
        (0, 0, "acc", 0.75),
    ]


def test_tensor_values_are_read_when_the_log_is_read_and_never_held_past_the_limit():
    """Note [Logging device tensors]: the log keeps a 0-d tensor (a device tensor, on a GPU) and
    reads it on the first read, or once `_DEFERRED_LIMIT` wait; a CPU tensor stands in here."""
    from nbdist.telemetry import metrics
    from nbdist.telemetry.metrics import MetricLog

    log = MetricLog()
    value = torch.tensor(2.0)
    log.add(0, None, {"loss": value, "lr": 1})
    value.fill_(3.0)  # read late: what the tensor holds when the log is read
    assert [(r[2], r[3]) for r in log.records()] == [("loss", 3.0), ("lr", 1.0)]
    assert type(log.records()[0][3]) is float and log.last("loss") == (0, 0, 3.0)
    assert log.tail(1)[0][2:4] == ("lr", 1.0)

    last = metrics._DEFERRED_LIMIT - 2  # one value waits already: the limit is reached here
    for step in range(last + 1):
        log.add(1, step, {"loss": torch.tensor(float(step))})
    assert log._deferred == []  # every waiting value was read and let go of its tensor
    assert all(d._tensor is None for d in (entry[3] for entry in log._log) if hasattr(d, "_tensor"))
    assert log.last("loss") == (1, last, float(last))


def test_log_in_replica_context_records_each_replica():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])

    def step():
        rid = nd.get_replica_context().replica_id_in_sync_group
        nd.log(step=7, loss=float(rid) + 0.5)

    strategy.run(step)
    got = sorted((r[0], r[1], r[3]) for r in metric_log().records())
    assert got == [(0, 7, 0.5), (1, 7, 1.5)]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"loss": torch.ones(3)}, "'loss'"),
        ({"acc": "high"}, "'acc'"),
        ({"flag": True}, "'flag'"),
        ({"vals": [1.0, 2.0]}, "'vals'"),
    ],
)
def test_log_refuses_non_scalars_naming_the_key(kwargs, needle):
    with pytest.raises(TypeError, match=needle):
        nd.log(**kwargs)
    assert len(metric_log()) == 0


def test_log_refuses_a_non_string_name_and_a_bad_step():
    with pytest.raises(TypeError):
        nd.log(**{1: 2.0})
    with pytest.raises(TypeError, match="step"):
        nd.log(step="3", loss=1.0)


def test_progress_shows_one_bar_for_replica_zero_only():
    strategy = nd.MirroredStrategy(["cpu:0", "cpu:1"])
    streams = {0: io.StringIO(), 1: io.StringIO()}

    def loop():
        rid = nd.get_replica_context().replica_id_in_sync_group
        return sum(nd.progress(range(5), file=streams[rid], desc="epoch"))

    result = strategy.run(loop)
    assert result == 10 or all(v == 10 for v in result.values)
    assert "epoch" in streams[0].getvalue()
    assert streams[1].getvalue() == ""
