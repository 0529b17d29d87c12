"""Strategies: where replicas run and how variables are kept (one module each)."""

from nbdist.strategies.base import ReplicaContext, Strategy, StrategyExtended
from nbdist.strategies.central_storage import CentralStorageStrategy
from nbdist.strategies.mirrored import MirroredStrategy
from nbdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from nbdist.strategies.one_device import DefaultStrategy, OneDeviceStrategy
from nbdist.strategies.parameter_server import ParameterServerStrategy, Server

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
