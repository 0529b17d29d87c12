"""`TorchrunClusterResolver` (beyond TensorFlow): the cluster of a `torchrun` launch.

`torchrun` (and `torch.distributed.launch`, and launchers that imitate it) give each process
`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`. Every
process is a `"worker"`; its `task_id` is its `RANK`.

Example:
    >>> env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
    ...        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    >>> resolver = TorchrunClusterResolver(environ=env)
    >>> resolver.task_type, resolver.task_id, resolver.local_rank, resolver.master()
    ('worker', 2, 0, '10.0.0.1:29500')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from nbdist.cluster_resolver.base import (
    ClusterResolver,
    format_address,
    format_master_url,
    validate_port,
)
from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.errors import ClusterConfigError

__all__ = ["TorchrunClusterResolver"]


class TorchrunClusterResolver(ClusterResolver):
    """A cluster resolver reading the variables `torchrun` sets.

    The variables are read and checked once, when the resolver is built (a launcher sets them
    before the process starts and never changes them).

    `torchrun` tells a process only the rendezvous address, not where the other workers run, so
    the cluster spec uses placeholder addresses: worker `i` is `MASTER_ADDR:(MASTER_PORT + i)`.
    Worker 0's is the real rendezvous address (what `master()` returns); the others are distinct
    names for the tasks, not addresses anything listens on, and nbdist never connects to them.

    Args:
        environ: the environment to read (default `os.environ`), for tests and
            `resolve_cluster(environ)`.

    Raises:
        ClusterConfigError: (a `ValueError`) `RANK`, `WORLD_SIZE` or `MASTER_ADDR` missing; a
            value that is not a non-negative integer; `RANK >= WORLD_SIZE`;
            `LOCAL_RANK >= LOCAL_WORLD_SIZE`; `MASTER_PORT` outside 1..65535 (or too high to
            number `WORLD_SIZE` tasks). Each message names the variable and its value.

    Example:
        >>> env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "1234"}
        >>> resolver = TorchrunClusterResolver(environ=env)
        >>> resolver.cluster_spec(), resolver.world_size
        (ClusterSpec({'worker': ['node0:1234', 'node0:1235']}), 2)
    """

    def __init__(self, *, environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        world_size = _int_var(env, "WORLD_SIZE", minimum=1)
        rank = _int_var(env, "RANK", minimum=0)
        if rank >= world_size:
            raise ClusterConfigError(
                f"RANK is {rank} but WORLD_SIZE is {world_size}, so ranks run 0..{world_size - 1}. "
                f"Set RANK below WORLD_SIZE (torchrun sets both; check the launcher)."
            )
        local_world_size = _int_var(env, "LOCAL_WORLD_SIZE", minimum=1, required=False)
        local_rank = _int_var(env, "LOCAL_RANK", minimum=0, required=False)
        if local_world_size is not None and local_world_size > world_size:
            raise ClusterConfigError(
                f"LOCAL_WORLD_SIZE is {local_world_size}, more than WORLD_SIZE {world_size}. "
                f"Set LOCAL_WORLD_SIZE to the number of processes on this node."
            )
        if (
            local_rank is not None
            and local_world_size is not None
            and local_rank >= local_world_size
        ):
            raise ClusterConfigError(
                f"LOCAL_RANK is {local_rank} but LOCAL_WORLD_SIZE is {local_world_size}, so local "
                f"ranks run 0..{local_world_size - 1}. Set LOCAL_RANK below LOCAL_WORLD_SIZE."
            )
        master_addr = env.get("MASTER_ADDR", "").strip()
        if not master_addr:
            raise ClusterConfigError(
                f"MASTER_ADDR is {env.get('MASTER_ADDR')!r}: with RANK and WORLD_SIZE set, it "
                f"must name the host of rank 0. Set MASTER_ADDR (e.g. '10.0.0.1') and "
                f"MASTER_PORT, or launch with torchrun."
            )
        if "MASTER_PORT" not in env:
            raise ClusterConfigError(
                "MASTER_PORT is not set: with RANK and WORLD_SIZE set, it must be the rendezvous "
                "port of rank 0. Set MASTER_PORT (e.g. 29500), or launch with torchrun."
            )
        master_port = validate_port(env["MASTER_PORT"], variable="MASTER_PORT")
        if master_port + world_size - 1 > 65535:
            raise ClusterConfigError(
                f"MASTER_PORT is {master_port}; with WORLD_SIZE {world_size} the task addresses "
                f"would need ports up to {master_port + world_size - 1}, past 65535. Choose "
                f"MASTER_PORT <= {65536 - world_size}."
            )
        self._world_size = world_size
        self._local_rank = local_rank
        self._local_world_size = local_world_size
        self._master_addr = master_addr
        self._master_port = master_port
        self._task_type = "worker"
        self._task_id = rank
        self._rpc_layer = None

    def cluster_spec(self) -> ClusterSpec:
        """`{"worker": [...]}` with `WORLD_SIZE` entries (placeholders beyond worker 0).

        Example:
            >>> env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "::1", "MASTER_PORT": "80"}
            >>> TorchrunClusterResolver(environ=env).cluster_spec()
            ClusterSpec({'worker': ['[::1]:80']})
        """
        return ClusterSpec(
            {
                "worker": [
                    format_address(self._master_addr, self._master_port + i, variable="MASTER_PORT")
                    for i in range(self._world_size)
                ]
            }
        )

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """`MASTER_ADDR:MASTER_PORT`, or the given task's address; prefixed by `rpc_layer://`.

        Example:
            >>> env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "9"}
            >>> TorchrunClusterResolver(environ=env).master(rpc_layer="tcp")
            'tcp://h:9'
        """
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
        else:
            address = format_address(self._master_addr, self._master_port, variable="MASTER_PORT")
        return format_master_url(address, rpc_layer or self.rpc_layer)

    @property
    def world_size(self) -> int:
        """`WORLD_SIZE`: the number of worker processes."""
        return self._world_size

    @property
    def local_rank(self) -> int | None:
        """`LOCAL_RANK`: this process's index on its node (`None` if not set)."""
        return self._local_rank

    @property
    def local_world_size(self) -> int | None:
        """`LOCAL_WORLD_SIZE`: the processes on this node (`None` if not set)."""
        return self._local_world_size


def _int_var(env: Mapping[str, str], name: str, *, minimum: int, required: bool = True) -> Any:
    if name not in env:
        if not required:
            return None
        raise ClusterConfigError(
            f"{name} is not set, so this is not a torchrun launch. Launch with torchrun (which "
            f"sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT) or set {name}."
        )
    value = env[name]
    if not value.strip().isdecimal() or int(value) < minimum:
        raise ClusterConfigError(
            f"{name} is {value!r}; it must be an integer >= {minimum}. Check the launcher "
            f"(torchrun sets it for every process)."
        )
    return int(value)
