"""`SimpleClusterResolver`: a resolver that returns exactly what it was given.

Example:
    >>> resolver = SimpleClusterResolver(ClusterSpec({"worker": ["w0:2222", "w1:2222"]}),
    ...                                  task_type="worker", task_id=1, rpc_layer="grpc")
    >>> resolver.master("worker", 0), resolver.task_id
    ('grpc://w0:2222', 1)
"""

from __future__ import annotations

from typing import Any

from nbdist.cluster_resolver._errors import ClusterTypeError
from nbdist.cluster_resolver.base import ClusterResolver, format_master_url
from nbdist.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["SimpleClusterResolver"]


class SimpleClusterResolver(ClusterResolver):
    """A cluster resolver built from a `ClusterSpec` and the attributes you pass (as TF's).

    Use it to describe a cluster by hand, or, inside a `UnionResolver`, to override one
    attribute (such as `num_accelerators`) of another resolver.

    Args:
        cluster_spec: the cluster, a `ClusterSpec`.
        master: what `master()` returns when no task is named.
        task_type: this process's job.
        task_id: this process's index within its job.
        environment: `"google"` or `""`.
        num_accelerators: what `num_accelerators()` returns, e.g. `{"GPU": 8}`; `None` gives
            `{}` (as in TensorFlow, this resolver does not detect devices).
        rpc_layer: the protocol prefix of `master()`, e.g. `"grpc"`.

    Raises:
        ClusterConfigError: (also a `TypeError`) `cluster_spec` is not a `ClusterSpec` or
            `master` is not a string.

    Example:
        >>> cluster = ClusterSpec({"worker": ["worker0.example.com:2222",
        ...                                   "worker1.example.com:2222"]})
        >>> resolver = SimpleClusterResolver(cluster, task_type="worker", task_id=0,
        ...                                  num_accelerators={"GPU": 8}, rpc_layer="grpc")
        >>> resolver.num_accelerators(), resolver.master("worker", 1)
        ({'GPU': 8}, 'grpc://worker1.example.com:2222')
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ):
        if not isinstance(cluster_spec, ClusterSpec):
            raise ClusterTypeError(
                f"SimpleClusterResolver needs a ClusterSpec as cluster_spec; got "
                f"{type(cluster_spec).__name__} {cluster_spec!r}. Wrap it: "
                f"SimpleClusterResolver(ClusterSpec({cluster_spec!r}))."
            )
        if not isinstance(master, str):
            raise ClusterTypeError(
                f"SimpleClusterResolver's master must be a string like 'host:2222' or ''; got "
                f"{type(master).__name__} {master!r}."
            )
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The `ClusterSpec` given to the constructor.

        Example:
            >>> SimpleClusterResolver(ClusterSpec({"ps": ["p0:1"]})).cluster_spec().jobs
            ['ps']
        """
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of task `task_id` of `task_type` when both are given, else `master`.

        Args:
            task_type: the job of the master task.
            task_id: the index of the master task.
            rpc_layer: the protocol prefix; defaults to the constructor's `rpc_layer`.

        Raises:
            ClusterConfigError: (a `ValueError`) no such job or task in the cluster.

        Example:
            >>> resolver = SimpleClusterResolver(ClusterSpec({"w": ["a:1"]}), master="m:9")
            >>> resolver.master(), resolver.master("w", 0, rpc_layer="grpc")
            ('m:9', 'grpc://a:1')
        """
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = self._master
        return format_master_url(address, rpc_layer or self._rpc_layer)

    @property
    def environment(self) -> str:
        """The `environment` given to the constructor."""
        return self._environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """The `num_accelerators` given to the constructor, or `{}` (no detection).

        Example:
            >>> SimpleClusterResolver(ClusterSpec({})).num_accelerators()
            {}
        """
        del task_type, task_id, config_proto
        return {} if self._num_accelerators is None else self._num_accelerators
