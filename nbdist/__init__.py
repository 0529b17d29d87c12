"""nbdist: TensorFlow's `tf.distribute` programming model for PyTorch, from a notebook.

`import nbdist as nd`. Importing starts no process, opens no socket and initialises no CUDA.
The whole public API is listed here.
"""

from nbdist import checkpoint, cluster_resolver, datasets, debug, errors, experimental
from nbdist._extension import load_ipython_extension, unload_ipython_extension
from nbdist.cluster import Cluster, RemoteError, remote
from nbdist.cluster_resolver import ClusterSpec
from nbdist.cross_device_ops import (
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from nbdist.errors import (
    CheckpointError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    NbdistError,
    PSUnavailableError,
    RendezvousError,
    ReplicaReleasedError,
    StrategyMixingError,
    WorkerLostError,
)
from nbdist.input import (
    DistributedDataset,
    DistributedIterator,
    InputContext,
    InputOptions,
    InputReplicationMode,
)
from nbdist.metrics import log, progress
from nbdist.reduce import ReduceOp
from nbdist.strategies import (
    CentralStorageStrategy,
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    ParameterServerStrategy,
    ReplicaContext,
    Server,
    Strategy,
    StrategyExtended,
)
from nbdist.strategies.current import (
    experimental_set_strategy,
    get_loss_reduction,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from nbdist.strategies.losses import compute_average_loss, scale_regularization_loss
from nbdist.values import DistributedValues, Mirrored, PerReplica
from nbdist.variables import (
    MirroredVariable,
    SyncOnReadVariable,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)


def dashboard(target=None):
    """The live dashboard widget (`nbdist.widgets.dashboard.dashboard`); imports ipywidgets
    and matplotlib only when called."""
    from nbdist.widgets.dashboard import dashboard as _dashboard

    return _dashboard(target)


__version__ = "0.1.0.dev0"  # the one place: pyproject.toml reads it (engines on hosts check it)

__all__ = [
    "CentralStorageStrategy",
    "CheckpointError",
    "Cluster",
    "ClusterSpec",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "DistributedValues",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Mirrored",
    "MirroredStrategy",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "NbdistError",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "PSUnavailableError",
    "ParameterServerStrategy",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "RemoteError",
    "RendezvousError",
    "ReplicaContext",
    "ReplicaReleasedError",
    "Server",
    "Strategy",
    "StrategyExtended",
    "StrategyMixingError",
    "SyncOnReadVariable",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "WorkerLostError",
    "checkpoint",
    "cluster_resolver",
    "compute_average_loss",
    "dashboard",
    "datasets",
    "debug",
    "errors",
    "experimental",
    "experimental_set_strategy",
    "get_loss_reduction",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "load_ipython_extension",
    "log",
    "progress",
    "remote",
    "scale_regularization_loss",
    "unload_ipython_extension",
]
