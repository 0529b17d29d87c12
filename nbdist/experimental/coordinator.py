"""TensorFlow's `tf.distribute.experimental.coordinator` names."""

from nbdist.strategies.parameter_server.coordinator import (
    ClusterCoordinator,
    PerWorkerDataset,
    PerWorkerIterator,
    RemoteValue,
)

PerWorkerValues = PerWorkerIterator

__all__ = [
    "ClusterCoordinator",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "PerWorkerValues",
    "RemoteValue",
]
