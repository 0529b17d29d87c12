"""Engines' records merged for the dashboard: feeds sent at different moments, steps per step."""

from __future__ import annotations

import pytest

from nbdist.telemetry.records import CollectiveRecord, StepRecord
from nbdist.telemetry.timeline import blame, step_split, straggler
from nbdist.widgets._data import _common_tails, _merge_collectives


def _engine(rank: int, lag: float, count: int, sent: int) -> dict:
    """One engine's telemetry as its feed carries it: the first `sent` of `count` collectives
    and steps (its newest records not sent yet), arriving `lag` s after each step starts."""
    collectives = [
        CollectiveRecord("all_reduce:MEAN", 64, "gloo", (rank,), k + lag, 0.15 - lag, (0.0,))
        for k in range(count)
    ]
    steps = [StepRecord((rank,), float(k), 0.2) for k in range(count)]
    return {
        "collectives": collectives[:sent],
        "appended": sent,
        "steps": steps[:sent],
        "steps_appended": sent,
    }


def test_feeds_sent_at_different_moments_pair_the_same_collective():
    # Engine 0 has sent all 10 collectives, engine 1 (100 ms late every step) only 8 so far.
    telemetry = [_engine(0, 0.0, 10, 10), _engine(1, 0.1, 10, 8)]
    merged = _merge_collectives(_common_tails(telemetry, "collectives", "appended"))
    assert len(merged) == 8
    for k, record in enumerate(merged):
        assert isinstance(record, CollectiveRecord)
        assert record.replicas == (0, 1)
        assert record.start == pytest.approx(k)
        assert record.duration == pytest.approx(0.15)
        assert record.waits == pytest.approx((0.1, 0.0))  # replica 0 waited 100 ms for replica 1
    assert straggler(merged) == 1
    assert blame(merged)[1] == pytest.approx(0.8)


def test_one_point_per_training_step_not_per_replica_and_step():
    telemetry = [_engine(0, 0.0, 10, 10), _engine(1, 0.1, 10, 8)]
    steps = [s for part in _common_tails(telemetry, "steps", "steps_appended") for s in part]
    assert len(steps) == 16
    split = step_split(steps, [])
    assert [start for start, _, _ in split] == pytest.approx(list(range(8)))
    assert all(duration == pytest.approx(0.2) for _, duration, _ in split)


def test_common_tails_of_nothing_and_of_one_engine():
    assert _common_tails([], "collectives", "appended") == []
    one = _engine(0, 0.0, 3, 3)
    assert _common_tails([one], "collectives", "appended") == [one["collectives"]]
