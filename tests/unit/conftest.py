"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from nbdist.telemetry.metrics import metric_log


@pytest.fixture
def fresh_metrics():
    """This process's `nd.log` records, empty before and after the test (the log is global)."""
    metric_log().clear()
    yield metric_log()
    metric_log().clear()
