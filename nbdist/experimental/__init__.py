"""TensorFlow's `tf.distribute.experimental` names."""

from nbdist.communication import CommunicationImplementation, CommunicationOptions
from nbdist.input import ValueContext
from nbdist.strategies.central_storage import CentralStorageStrategy

CollectiveCommunication = CommunicationImplementation

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ValueContext",
]
