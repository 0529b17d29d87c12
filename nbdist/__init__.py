"""nbdist: TensorFlow's `tf.distribute` programming model for PyTorch, from a notebook.

`import nbdist as nd`. Importing starts no process, opens no socket and initialises no CUDA.
The whole public API is listed here (`__all__`).

Note [Lazy public API]: `import nbdist` (and so `%load_ext nbdist`) imports none of torch,
ipyparallel, matplotlib or ipywidgets; each public name is imported from its module the first
time it is used (`nd.MirroredStrategy` imports torch then), through the module's `__getattr__`
(PEP 562). `%load_ext nbdist` thus takes a few milliseconds, and `%dist start` can say what it
does before the slow imports begin. `_LAZY` maps every public name to its module.

Example:
    >>> import nbdist as nd
    >>> nd.ReduceOp.SUM.name
    'SUM'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbdist import _moved  # noqa: F401  old import paths the docs showed (one release)
from nbdist._extension import load_ipython_extension, unload_ipython_extension
from nbdist.core.lazy import import_lazily

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` imports
    from nbdist import checkpoint, cluster_resolver, debug, errors, experimental
    from nbdist.app import datasets
    from nbdist.cluster import Cluster, RemoteError, remote
    from nbdist.cluster_resolver import ClusterSpec
    from nbdist.core.reduce.cross_device import (
        CrossDeviceOps,
        HierarchicalCopyAllReduce,
        NcclAllReduce,
        ReductionToOneDevice,
    )
    from nbdist.core.reduce.op import ReduceOp
    from nbdist.core.scale_hooks import ScaleEvent, on_scale
    from nbdist.core.values import DistributedValues, Mirrored, PerReplica
    from nbdist.core.variables import (
        MirroredVariable,
        SyncOnReadVariable,
        Variable,
        VariableAggregation,
        VariableSynchronization,
    )
    from nbdist.debug.breakpoints import breakpoint
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
    from nbdist.telemetry.metrics import log, progress

_LAZY: dict[str, str] = {
    "checkpoint": "nbdist.checkpoint",  # a subpackage
    "cluster_resolver": "nbdist.cluster_resolver",  # a subpackage
    "datasets": "nbdist.app.datasets",  # a subpackage
    "debug": "nbdist.debug",  # a subpackage
    "breakpoint": "nbdist.debug.breakpoints",
    "errors": "nbdist.errors",  # a subpackage
    "experimental": "nbdist.experimental",  # a subpackage
    "Cluster": "nbdist.cluster",
    "RemoteError": "nbdist.cluster.errors",
    "remote": "nbdist.cluster.refs",
    "ClusterSpec": "nbdist.cluster_resolver",
    "CrossDeviceOps": "nbdist.core.reduce.cross_device",
    "HierarchicalCopyAllReduce": "nbdist.core.reduce.cross_device",
    "NcclAllReduce": "nbdist.core.reduce.cross_device",
    "ReductionToOneDevice": "nbdist.core.reduce.cross_device",
    "CheckpointError": "nbdist.errors",
    "CollectiveMismatchError": "nbdist.errors",
    "CollectiveTimeoutError": "nbdist.errors",
    "NbdistError": "nbdist.errors",
    "PSUnavailableError": "nbdist.errors",
    "RendezvousError": "nbdist.errors",
    "ReplicaReleasedError": "nbdist.errors",
    "StrategyMixingError": "nbdist.errors",
    "WorkerLostError": "nbdist.errors",
    "DistributedDataset": "nbdist.input",
    "DistributedIterator": "nbdist.input",
    "InputContext": "nbdist.input",
    "InputOptions": "nbdist.input",
    "InputReplicationMode": "nbdist.input",
    "log": "nbdist.telemetry.metrics",
    "on_scale": "nbdist.core.scale_hooks",
    "ScaleEvent": "nbdist.core.scale_hooks",
    "progress": "nbdist.telemetry.metrics",
    "ReduceOp": "nbdist.core.reduce.op",
    "CentralStorageStrategy": "nbdist.strategies",
    "MirroredStrategy": "nbdist.strategies",
    "MultiWorkerMirroredStrategy": "nbdist.strategies",
    "OneDeviceStrategy": "nbdist.strategies",
    "ParameterServerStrategy": "nbdist.strategies",
    "ReplicaContext": "nbdist.strategies",
    "Server": "nbdist.strategies",
    "Strategy": "nbdist.strategies",
    "StrategyExtended": "nbdist.strategies",
    "experimental_set_strategy": "nbdist.strategies.current",
    "get_loss_reduction": "nbdist.strategies.current",
    "get_replica_context": "nbdist.strategies.current",
    "get_strategy": "nbdist.strategies.current",
    "has_strategy": "nbdist.strategies.current",
    "in_cross_replica_context": "nbdist.strategies.current",
    "compute_average_loss": "nbdist.strategies.losses",
    "scale_regularization_loss": "nbdist.strategies.losses",
    "DistributedValues": "nbdist.core.values",
    "Mirrored": "nbdist.core.values",
    "PerReplica": "nbdist.core.values",
    "MirroredVariable": "nbdist.core.variables",
    "SyncOnReadVariable": "nbdist.core.variables",
    "Variable": "nbdist.core.variables",
    "VariableAggregation": "nbdist.core.variables",
    "VariableSynchronization": "nbdist.core.variables",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (Note [Lazy public API])."""
    # also a submodule not named in the public API (`nd.strategies`), reachable as it was when
    # `import nbdist` imported every layer
    return import_lazily(__name__, globals(), _LAZY, name, submodules=True)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "ScaleEvent",
    "Server",
    "Strategy",
    "StrategyExtended",
    "StrategyMixingError",
    "SyncOnReadVariable",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "WorkerLostError",
    "breakpoint",
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
    "on_scale",
    "progress",
    "remote",
    "scale_regularization_loss",
    "unload_ipython_extension",
]
