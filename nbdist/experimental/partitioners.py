"""TensorFlow's `tf.distribute.experimental.partitioners` names."""

from nbdist.strategies.parameter_server.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
)

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner"]
