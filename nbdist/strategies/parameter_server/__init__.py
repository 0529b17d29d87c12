"""`ParameterServerStrategy`, its `ClusterCoordinator`, partitioners and `Server`.

Variables live on ps tasks (`ps_task`), workers run scheduled functions (`worker_task`),
tensors move over gloo point-to-point (`transport`), the chief schedules (`coordinator`).
"""

from nbdist.strategies.parameter_server import partitioners
from nbdist.strategies.parameter_server.coordinator import (
    ClusterCoordinator,
    PerWorkerDataset,
    PerWorkerIterator,
    RemoteValue,
)
from nbdist.strategies.parameter_server.ps_variables import PSVariable
from nbdist.strategies.parameter_server.server import Server
from nbdist.strategies.parameter_server.strategy import ParameterServerStrategy

__all__ = [
    "ClusterCoordinator",
    "PSVariable",
    "ParameterServerStrategy",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "RemoteValue",
    "Server",
    "partitioners",
]
