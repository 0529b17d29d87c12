"""The dashboard's training view flags replicas whose parameters differ (the replica check),
not replicas whose losses differ (they do whenever the replicas see different data)."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from nbdist.telemetry.metrics import MetricRecord
from nbdist.telemetry.records import ReplicaCheck
from nbdist.widgets._canvas import new_figure
from nbdist.widgets._data import DashboardData
from nbdist.widgets.training import TrainingView, draw_training


def _metrics(values_per_replica: dict[int, list[float]]) -> list[MetricRecord]:
    return [
        MetricRecord(replica, step, "loss", value, 1000.0 + step)
        for replica, values in values_per_replica.items()
        for step, value in enumerate(values)
    ]


def _titles(data: DashboardData) -> list[str]:
    fig = new_figure(9, 3.5)
    draw_training(fig, data)
    return [ax.get_title() for ax in fig.axes] + [t.get_text() for t in fig.texts]


def test_different_losses_on_different_data_are_not_flagged():
    data = DashboardData(metrics=_metrics({0: [1.0] * 12, 1: [2.0] * 12}))
    assert not any("diverge" in title for title in _titles(data))


def test_failed_replica_check_is_flagged_even_with_equal_losses():
    check = ReplicaCheck(2000.0, False, "The replicas' copies of 1 of 4 parameter(s) ...")
    data = DashboardData(metrics=_metrics({0: [1.0] * 12, 1: [1.0] * 12}), replica_check=check)
    titles = _titles(data)
    assert "loss  ⚠ replicas diverge" in titles
    assert any("ReplicasDivergedError" in title for title in titles)
    passed = DashboardData(metrics=data.metrics, replica_check=ReplicaCheck(2001.0, True))
    assert not any("diverge" in title for title in _titles(passed))


def test_view_redraws_when_only_the_check_changes():
    view = TrainingView()
    data = DashboardData(metrics=_metrics({0: [1.0] * 3, 1: [1.0] * 3}))
    assert view.update(data) is True
    assert view.update(data) is False
    diverged = DashboardData(metrics=data.metrics, replica_check=ReplicaCheck(5.0, False, "x"))
    assert view.update(diverged) is True
