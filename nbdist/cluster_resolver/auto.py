"""`resolve_cluster`: the cluster resolver the environment calls for, if any.

The order is docs/api.md §4's: `TF_CONFIG`, then the torchrun variables, then a Slurm job step.

Example:
    >>> resolve_cluster({}) is None
    True
    >>> type(resolve_cluster({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h",
    ...                       "MASTER_PORT": "29500"})).__name__
    'TorchrunClusterResolver'
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from nbdist.cluster_resolver.base import ClusterResolver
from nbdist.cluster_resolver.slurm import SlurmClusterResolver
from nbdist.cluster_resolver.tf_config import TFConfigClusterResolver
from nbdist.cluster_resolver.torchrun import TorchrunClusterResolver

__all__ = ["resolve_cluster"]


def resolve_cluster(environ: MutableMapping[str, str] | None = None) -> ClusterResolver | None:
    """The resolver for the cluster this process was launched into, or `None` for none.

    1. `TF_CONFIG` describing a cluster: a `TFConfigClusterResolver` (`{}`, blank, or an
       empty `"cluster"` count as unset, as in TensorFlow).
    2. `RANK` and `WORLD_SIZE` set (torchrun and launchers like it): a
       `TorchrunClusterResolver`.
    3. Inside a Slurm job step of more than one task (`SLURM_PROCID` and
       `SLURM_STEP_NUM_TASKS` > 1, which `srun` sets; a batch script or an interactive
       allocation is not a step): a `SlurmClusterResolver` with its defaults, except that it
       leaves `CUDA_VISIBLE_DEVICES` alone (`auto_set_gpu=False`): the strategy places
       devices itself.
    4. Otherwise `None`: a single worker over the local devices.

    Args:
        environ: the environment to inspect (default `os.environ`).

    Raises:
        ClusterConfigError: (a `ValueError`) the chosen source is malformed (e.g. `TF_CONFIG`
            that is not JSON): a broken description is never silently ignored.

    Example:
        >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]},'
        ...                     ' "task": {"type": "worker", "index": 1}}', "RANK": "0"}
        >>> resolve_cluster(env).task_id
        1
    """
    env = os.environ if environ is None else environ
    if env.get("TF_CONFIG", "").strip():
        resolver = TFConfigClusterResolver(environ=env)
        if resolver.cluster_spec().jobs:
            return resolver
        # `TF_CONFIG='{}'` (or an empty cluster) describes no cluster: as if it were unset.
    if "RANK" in env and "WORLD_SIZE" in env:
        return TorchrunClusterResolver(environ=env)
    if _in_slurm_step(env):
        return SlurmClusterResolver(auto_set_gpu=False, environ=env)
    return None


def _in_slurm_step(env: MutableMapping[str, str]) -> bool:
    step_tasks = env.get("SLURM_STEP_NUM_TASKS", "").strip()
    return "SLURM_PROCID" in env and step_tasks.isdecimal() and int(step_tasks) > 1
