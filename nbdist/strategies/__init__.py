"""Strategies: where replicas run and how variables are kept (one module each).

Each name below is imported from its module on first use (as `nbdist`'s, Note [Lazy public
API]): an engine that needs `MultiWorkerMirroredStrategy` does not import the parameter-server
machinery with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbdist.core.lazy import import_lazily

if TYPE_CHECKING:
    from nbdist.strategies.base import ReplicaContext, Strategy, StrategyExtended
    from nbdist.strategies.central_storage import CentralStorageStrategy
    from nbdist.strategies.mirrored import MirroredStrategy
    from nbdist.strategies.multi_worker import MultiWorkerMirroredStrategy
    from nbdist.strategies.one_device import DefaultStrategy, OneDeviceStrategy
    from nbdist.strategies.parameter_server import ParameterServerStrategy, Server

_LAZY: dict[str, str] = {
    "ReplicaContext": "nbdist.strategies.base",
    "Strategy": "nbdist.strategies.base",
    "StrategyExtended": "nbdist.strategies.base",
    "CentralStorageStrategy": "nbdist.strategies.central_storage",
    "MirroredStrategy": "nbdist.strategies.mirrored",
    "MultiWorkerMirroredStrategy": "nbdist.strategies.multi_worker",
    "DefaultStrategy": "nbdist.strategies.one_device",
    "OneDeviceStrategy": "nbdist.strategies.one_device",
    "ParameterServerStrategy": "nbdist.strategies.parameter_server",
    "Server": "nbdist.strategies.parameter_server",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    return import_lazily(__name__, globals(), _LAZY, name)


__all__ = [
    "CentralStorageStrategy",
    "DefaultStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "ReplicaContext",
    "Server",
    "Strategy",
    "StrategyExtended",
]
