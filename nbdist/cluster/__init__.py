"""Engines for notebooks (layer 3 of ARCHITECTURE.md): `Cluster`, `EngineStrategy`, `remote`.

`nd.Cluster(n=2)` starts ipyparallel engines joined in one `torch.distributed` group, each
holding a `MultiWorkerMirroredStrategy` as `strategy`; `cluster.strategy` runs functions on
them from the notebook and brings results back as `PerReplica` values. Importing this package
starts nothing and imports neither ipyparallel nor torch: each name below is imported from its
module on first use (as `nbdist`'s, Note [Lazy public API]), so the controller and the engines,
which run modules of this package (`_controller_main`, `parent_watch`), import only what they
use (the controller imported torch through this file: 1-2 s of CPU at every start).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from nbdist.core.lazy import import_lazily

if TYPE_CHECKING:
    from nbdist.cluster.engine_strategy import EngineStrategy
    from nbdist.cluster.engines import Cluster
    from nbdist.cluster.errors import (
        ClusterInterrupted,
        ClusterStartError,
        ClusterStoppedError,
        ClusterUnusableError,
        EngineTimeoutError,
        RemoteError,
        RemoteFailure,
        RemoteNameError,
        ScaleFailedError,
        ScaleRefusedError,
        SerializationError,
    )
    from nbdist.cluster.refs import RemoteRef, remote
    from nbdist.cluster.size_history import ScaleReport, SizeChange
    from nbdist.cluster.status import EngineInfo, EngineStatus, StatusTable

_LAZY: dict[str, str] = {
    "Cluster": "nbdist.cluster.engines",
    "ClusterInterrupted": "nbdist.cluster.errors",
    "ClusterStartError": "nbdist.cluster.errors",
    "ClusterStoppedError": "nbdist.cluster.errors",
    "ClusterUnusableError": "nbdist.cluster.errors",
    "EngineTimeoutError": "nbdist.cluster.errors",
    "RemoteError": "nbdist.cluster.errors",
    "RemoteFailure": "nbdist.cluster.errors",
    "RemoteNameError": "nbdist.cluster.errors",
    "ScaleFailedError": "nbdist.cluster.errors",
    "ScaleRefusedError": "nbdist.cluster.errors",
    "SerializationError": "nbdist.cluster.errors",
    "ScaleReport": "nbdist.cluster.size_history",
    "SizeChange": "nbdist.cluster.size_history",
    "EngineStrategy": "nbdist.cluster.engine_strategy",
    "RemoteRef": "nbdist.cluster.refs",
    "remote": "nbdist.cluster.refs",
    "EngineInfo": "nbdist.cluster.status",
    "EngineStatus": "nbdist.cluster.status",
    "StatusTable": "nbdist.cluster.status",
}


class _Package(types.ModuleType):
    """This package's module: its name `remote` is always the function `remote`, never the
    submodule `nbdist.cluster.engine_strategy` that Python binds there when it is imported (eagerly
    imported, the name was rebound right after; lazily, it must not be bound at all)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "remote" and isinstance(value, types.ModuleType):
            return  # the submodule stays in sys.modules; `remote` resolves through __getattr__
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    if name == "Cluster":  # Cluster(strategy="parameter_server") creates a PSCluster
        importlib.import_module("nbdist.cluster.ps_cluster")
    return import_lazily(__name__, globals(), _LAZY, name)


__all__ = [
    "Cluster",
    "ClusterInterrupted",
    "ClusterStartError",
    "ClusterStoppedError",
    "ClusterUnusableError",
    "EngineInfo",
    "EngineStatus",
    "EngineStrategy",
    "EngineTimeoutError",
    "RemoteError",
    "RemoteFailure",
    "RemoteNameError",
    "RemoteRef",
    "ScaleFailedError",
    "ScaleRefusedError",
    "ScaleReport",
    "SerializationError",
    "SizeChange",
    "StatusTable",
    "remote",
]
