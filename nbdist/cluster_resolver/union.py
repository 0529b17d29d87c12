"""`UnionResolver`: several cluster resolvers merged into one (TF's `UnionResolver`).

Example:
    >>> from nbdist.cluster_resolver import SimpleClusterResolver
    >>> workers = SimpleClusterResolver(ClusterSpec({"worker": ["w0:2222", "w1:2222"]}),
    ...                                 task_type="worker", task_id=0, rpc_layer="grpc")
    >>> servers = SimpleClusterResolver(ClusterSpec({"ps": ["p0:2222"]}), task_type="ps")
    >>> union = UnionResolver(workers, servers)
    >>> union.cluster_spec().as_dict(), union.task_type
    ({'worker': ['w0:2222', 'w1:2222'], 'ps': ['p0:2222']}, 'worker')
"""

from __future__ import annotations

from typing import Any

from nbdist.cluster_resolver._errors import ClusterKeyError, ClusterTypeError
from nbdist.cluster_resolver.base import ClusterResolver, format_master_url
from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.errors import ClusterConfigError

__all__ = ["UnionResolver"]

_OVERRIDES = ("rpc_layer", "task_type", "task_id")


class UnionResolver(ClusterResolver):
    """The union of several cluster resolvers.

    `cluster_spec()` merges theirs, job by job: when every resolver lists a job's tasks as a
    list, the lists are concatenated in argument order; when any gives a sparse dict, the tasks
    are merged by index and an index defined twice is an error. Every other attribute
    (`task_type`, `task_id`, `rpc_layer`, `environment`, `num_accelerators()`, `master()`)
    comes from the first resolver unless overridden here.

    Args:
        *resolvers: one or more `ClusterResolver`s.
        **kwargs: `task_type`, `task_id` or `rpc_layer` to override the first resolver's.

    Raises:
        ClusterConfigError: (a `ValueError`) no resolver, or an unknown keyword; (also a
            `TypeError`) an argument that is not a `ClusterResolver`.

    Example:
        >>> from nbdist.cluster_resolver import SimpleClusterResolver
        >>> base = SimpleClusterResolver(ClusterSpec({"worker": ["w0:1"]}), task_type="worker",
        ...                              task_id=0)
        >>> gpus = SimpleClusterResolver(ClusterSpec({}), num_accelerators={"GPU": 1})
        >>> union = UnionResolver(gpus, base, task_type="worker", task_id=0)
        >>> union.num_accelerators(), union.task_type, union.cluster_spec().jobs
        ({'GPU': 1}, 'worker', ['worker'])
    """

    def __init__(self, *resolvers: ClusterResolver, **kwargs: Any):
        unknown = sorted(set(kwargs) - set(_OVERRIDES))
        if unknown:
            raise ClusterConfigError(
                f"UnionResolver got unexpected keyword argument(s) {unknown}; it accepts only "
                f"{list(_OVERRIDES)}."
            )
        if not resolvers:
            raise ClusterConfigError(
                "UnionResolver needs at least one ClusterResolver; got none. Pass them as "
                "positional arguments: UnionResolver(resolver_a, resolver_b)."
            )
        for position, resolver in enumerate(resolvers):
            if not isinstance(resolver, ClusterResolver):
                raise ClusterTypeError(
                    f"UnionResolver argument {position} is {type(resolver).__name__} "
                    f"{resolver!r}, not a ClusterResolver. Wrap a ClusterSpec in "
                    f"SimpleClusterResolver(spec)."
                )
        self._resolvers = resolvers
        self._rpc_layer = kwargs.get("rpc_layer")
        self._task_type = kwargs.get("task_type")
        self._task_id = kwargs.get("task_id")

    def cluster_spec(self) -> ClusterSpec:
        """The merged `ClusterSpec` of every resolver, re-read at each call.

        Raises:
            ClusterConfigError: (also a `KeyError`) two resolvers define the same task index of
                a job given as a sparse dict.

        Example:
            >>> from nbdist.cluster_resolver import SimpleClusterResolver
            >>> a = SimpleClusterResolver(ClusterSpec({"worker": {1: "w1:1"}}))
            >>> b = SimpleClusterResolver(ClusterSpec({"worker": ["x0:1", "x1:1"]}))
            >>> UnionResolver(a, b).cluster_spec()  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            nbdist.cluster_resolver._errors.ClusterKeyError: Job 'worker' has task 1 defined...
        """
        specs = [resolver.cluster_spec().as_dict() for resolver in self._resolvers]
        sparse_jobs = {
            job for spec in specs for job, tasks in spec.items() if isinstance(tasks, dict)
        }
        merged: dict[str, Any] = {}
        for position, spec in enumerate(specs):
            for job, tasks in spec.items():
                if job not in sparse_jobs:
                    merged.setdefault(job, []).extend(tasks)
                    continue
                as_dict = tasks if isinstance(tasks, dict) else dict(enumerate(tasks))
                into = merged.setdefault(job, {})
                clashes = sorted(set(into) & set(as_dict))
                if clashes:
                    raise ClusterKeyError(
                        f"Job {job!r} has task {', '.join(map(str, clashes))} defined by more "
                        f"than one resolver (again by resolver {position}: {tasks!r}; before: "
                        f"{into!r}). Give each task index of a job to one resolver only."
                    )
                into.update(as_dict)
        return ClusterSpec(merged)

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The given task's address in the merged cluster, else the first resolver's master.

        The rpc layer is the one given, else this union's `rpc_layer` override, else (for the
        first resolver's master) that resolver's own.

        Example:
            >>> from nbdist.cluster_resolver import SimpleClusterResolver
            >>> a = SimpleClusterResolver(ClusterSpec({"worker": ["w0:1"]}), master="w0:1")
            >>> b = SimpleClusterResolver(ClusterSpec({"ps": ["p0:1"]}))
            >>> UnionResolver(a, b).master(), UnionResolver(a, b).master("ps", 0, "grpc")
            ('w0:1', 'grpc://p0:1')
        """
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
            return format_master_url(address, rpc_layer or self._rpc_layer)
        return self._resolvers[0].master(rpc_layer=rpc_layer or self._rpc_layer)

    @property
    def task_type(self) -> str | None:
        """The `task_type` override, else the first resolver's."""
        return self._task_type if self._task_type is not None else self._resolvers[0].task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The `task_id` override (`0` included), else the first resolver's."""
        return self._task_id if self._task_id is not None else self._resolvers[0].task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The `rpc_layer` override, else the first resolver's."""
        return self._rpc_layer or self._resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """The first resolver's `environment`."""
        return self._resolvers[0].environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """The first resolver's `num_accelerators()`."""
        return self._resolvers[0].num_accelerators(task_type, task_id, config_proto)
