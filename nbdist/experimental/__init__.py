"""TensorFlow's `tf.distribute.experimental` names."""

from nbdist.communication import CommunicationImplementation, CommunicationOptions
from nbdist.input import ValueContext
from nbdist.strategies.central_storage import CentralStorageStrategy
from nbdist.strategies.multi_worker import MultiWorkerMirroredStrategy

CollectiveCommunication = CommunicationImplementation

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ValueContext",
]
