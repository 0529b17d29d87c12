"""Telemetry: the record the collectives write, and what the dashboards compute from it.

`records` (the bounded in-memory record of every collective and step: `Telemetry`), `timeline`
(who waited for whom), `metrics` (`nd.log`), `holdings` (what each device holds).

`nbdist.telemetry` was the module that is now `nbdist.telemetry.records`; its names still
import from here for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from nbdist.errors import MovedModuleWarning


def __getattr__(name: str) -> Any:
    """`nbdist.telemetry.<name>` of the old module: its value in `records`, with a warning."""
    if name.startswith("__"):
        raise AttributeError(f"module 'nbdist.telemetry' has no attribute {name!r}")
    records = importlib.import_module("nbdist.telemetry.records")
    if not hasattr(records, name):
        raise AttributeError(f"module 'nbdist.telemetry' has no attribute {name!r}")
    warnings.warn(
        f"nbdist.telemetry.{name} moved to nbdist.telemetry.records.{name}; import it from there "
        "(the old path goes in the next release).",
        MovedModuleWarning,
        stacklevel=2,
    )
    return getattr(records, name)
