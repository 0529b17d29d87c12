"""TensorFlow's `tf.distribute.experimental` names."""

from nbdist.core.reduce.options import CommunicationImplementation, CommunicationOptions
from nbdist.experimental import coordinator, partitioners
from nbdist.input import ValueContext
from nbdist.strategies.central_storage import CentralStorageStrategy
from nbdist.strategies.fully_sharded import FullyShardedStrategy
from nbdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from nbdist.strategies.parameter_server import ParameterServerStrategy

CollectiveCommunication = CommunicationImplementation

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "FullyShardedStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "ValueContext",
    "coordinator",
    "partitioners",
]
