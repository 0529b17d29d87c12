"""Engines for notebooks (layer 3 of ARCHITECTURE.md): `Cluster`, `EngineStrategy`, `remote`.

`nd.Cluster(n=2)` starts ipyparallel engines joined in one `torch.distributed` group, each
holding a `MultiWorkerMirroredStrategy` as `strategy`; `cluster.strategy` runs functions on
them from the notebook and brings results back as `PerReplica` values. Importing this package
starts nothing and does not import ipyparallel.
"""

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
    SerializationError,
)
from nbdist.cluster.ps_cluster import PSCluster  # noqa: F401  (Cluster(strategy="parameter_server"))
from nbdist.cluster.refs import RemoteRef, remote
from nbdist.cluster.remote import EngineStrategy
from nbdist.cluster.status import EngineInfo, EngineStatus, StatusTable

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
    "SerializationError",
    "StatusTable",
    "remote",
]
