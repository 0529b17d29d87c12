"""Timing helpers shared by the parameter-server fault tests."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


def first_work_after(values: Iterable[Any], worker: int, since: float) -> float:
    """Wait for every `RemoteValue` in `values`; seconds from `since` (a `time.monotonic()`)
    until the first one that `worker` ran was done, or nan when it ran none."""
    first = None
    for value in values:
        value.get()
        if value.worker == worker and first is None:
            first = time.monotonic() - since
    return float("nan") if first is None else first
