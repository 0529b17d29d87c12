"""Cluster resolvers: which cluster this process belongs to (TF's `tf.distribute.cluster_resolver`).

Example:
    >>> from nbdist.cluster_resolver import ClusterSpec, SimpleClusterResolver
    >>> resolver = SimpleClusterResolver(ClusterSpec({"worker": ["w0:2222"]}), task_type="worker",
    ...                                  task_id=0)
    >>> resolver.cluster_spec().num_tasks("worker")
    1
"""

from __future__ import annotations

from nbdist.cluster_resolver.auto import resolve_cluster
from nbdist.cluster_resolver.base import ClusterResolver
from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.cluster_resolver.simple import SimpleClusterResolver
from nbdist.cluster_resolver.slurm import SlurmClusterResolver
from nbdist.cluster_resolver.tf_config import TFConfigClusterResolver
from nbdist.cluster_resolver.torchrun import TorchrunClusterResolver
from nbdist.cluster_resolver.union import UnionResolver

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "SimpleClusterResolver",
    "SlurmClusterResolver",
    "TFConfigClusterResolver",
    "TorchrunClusterResolver",
    "UnionResolver",
    "resolve_cluster",
]
