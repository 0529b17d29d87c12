"""`TFConfigClusterResolver`: the cluster described by the `TF_CONFIG` environment variable.

`TF_CONFIG` is JSON: `{"cluster": {job: [addresses]}, "task": {"type": job, "index": i}}`, with
optional `"rpc_layer"`, `"environment"` and `"session_master"`. As in TensorFlow it is re-read at
every call; unlike TensorFlow it is validated when the resolver is built (api.md §11): JSON, the
`cluster` key, every address's port, the task's type and index.

Example:
    >>> import json
    >>> env = {"TF_CONFIG": json.dumps({
    ...     "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
    ...     "task": {"type": "worker", "index": 1}})}
    >>> resolver = TFConfigClusterResolver(environ=env)
    >>> resolver.task_type, resolver.task_id, resolver.master()
    ('worker', 1, 'w1:2222')
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from nbdist.cluster_resolver.base import ClusterResolver, format_master_url, split_address
from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.errors import ClusterConfigError

__all__ = ["TFConfigClusterResolver"]

_VAR = "TF_CONFIG"
_EXAMPLE = (
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'
)
# TensorFlow lets an evaluator run beside the cluster without being one of its jobs.
_OUTSIDE_CLUSTER_TASK_TYPES = ("evaluator",)
# Keys that may stand without a "cluster" (an empty cluster, as in TensorFlow). A "task" may not:
# a task of no cluster is a broken description, and an unknown key is most likely a typo.
_KEYS_WITHOUT_CLUSTER = frozenset({"rpc_layer", "environment", "session_master"})


class TFConfigClusterResolver(ClusterResolver):
    """A cluster resolver reading `TF_CONFIG` (TF's `TFConfigClusterResolver`).

    Args:
        task_type: overrides `TF_CONFIG`'s `task.type`.
        task_id: overrides `TF_CONFIG`'s `task.index`.
        rpc_layer: overrides `TF_CONFIG`'s `rpc_layer`.
        environment: overrides `TF_CONFIG`'s `environment`.
        environ: the environment to read (default `os.environ`); beyond TensorFlow, for tests
            and for `resolve_cluster(environ)`.

    Raises:
        ClusterConfigError: (a `ValueError`) `TF_CONFIG` is set but is not a JSON object, has no
            `"cluster"`, has an address without a valid `host:port`, names a task type that is
            not a job of the cluster (an `"evaluator"` may be outside it, as in TensorFlow), or a
            task index past its job's size; the same checks apply to `task_type`/`task_id`.
            An unset or blank `TF_CONFIG`, or `{}`, is an empty cluster, as in TensorFlow.

    Example:
        >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["localhost:12345", "localhost:23456"]},'
        ...                     ' "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"}'}
        >>> resolver = TFConfigClusterResolver(environ=env)
        >>> resolver.cluster_spec()
        ClusterSpec({'worker': ['localhost:12345', 'localhost:23456']})
        >>> resolver.master(), resolver.master("worker", 1, rpc_layer="")
        ('grpc://localhost:12345', 'localhost:23456')
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ):
        self._environ = os.environ if environ is None else environ
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment
        config = _load(self._environ)
        if config is None:
            if task_id is not None:
                _task_index(task_id, "the task_id argument")
            return
        if task_type is not None and not isinstance(task_type, str):
            raise ClusterConfigError(
                f"task_type is {task_type!r} ({type(task_type).__name__}); it must be a job name "
                f"string such as 'worker'."
            )
        effective_type = task_type if task_type is not None else config.task_type
        if task_id is not None:
            effective_id = _task_index(task_id, "the task_id argument")
        else:
            effective_id = config.task_id
        type_source = "the task_type argument" if task_type is not None else "TF_CONFIG task.type"
        id_source = "the task_id argument" if task_id is not None else "TF_CONFIG task.index"
        _check_task(config.cluster, effective_type, effective_id, type_source, id_source)

    # -- the cluster ---------------------------------------------------------------------------

    def cluster_spec(self) -> ClusterSpec:
        """The `cluster` of `TF_CONFIG` as it is now (an empty `ClusterSpec` when it is unset).

        Example:
            >>> TFConfigClusterResolver(environ={}).cluster_spec()
            ClusterSpec({})
        """
        config = _load(self._environ)
        return ClusterSpec({}) if config is None else config.cluster

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The master's address, decided as TensorFlow does.

        `TF_CONFIG`'s `session_master` if set; `""` when the cluster is empty or is a single
        job with a single task; else the address of the given task (default: this process's
        own task, so a worker's master is itself, whether or not the cluster has a chief),
        prefixed by `rpc_layer://` when an rpc layer is given or configured.

        Raises:
            ClusterConfigError: (a `ValueError`) a multi-task cluster but no task type or index
                (none in `TF_CONFIG` and none given), or no such task in the cluster.

        Example:
            >>> env = {"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]},'
            ...                     ' "task": {"type": "chief", "index": 0}}'}
            >>> TFConfigClusterResolver(environ=env).master(), TFConfigClusterResolver(
            ...     environ=env).master("worker", 0, rpc_layer="grpc")
            ('c:1', 'grpc://w:1')
        """
        config = _load(self._environ)
        if config is not None and config.session_master is not None:
            return config.session_master
        spec = self.cluster_spec()
        jobs = spec.jobs
        if not jobs or (len(jobs) == 1 and len(spec.job_tasks(jobs[0])) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            raise ClusterConfigError(
                f"master() needs a task of the cluster {spec.as_dict()}, but TF_CONFIG has no "
                f"'task' with a type and an index and none was given (task_type={task_type!r}, "
                f'task_id={task_id!r}). Add e.g. "task": {{"type": "worker", "index": 0}} '
                f"to TF_CONFIG or call master('worker', 0)."
            )
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        return format_master_url(spec.task_address(task_type, task_id), rpc_layer)

    # -- this task -----------------------------------------------------------------------------

    @property
    def task_type(self) -> str | None:
        """The `task_type` argument, else `TF_CONFIG`'s `task.type`, else `None`."""
        if self._task_type is not None:
            return str(self._task_type)
        config = _load(self._environ)
        return None if config is None else config.task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The `task_id` argument, else `TF_CONFIG`'s `task.index`, else `None`."""
        if self._task_id is not None:
            return int(self._task_id)
        config = _load(self._environ)
        return None if config is None else config.task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The `rpc_layer` argument, else `TF_CONFIG`'s `rpc_layer`, else `None`."""
        if self._rpc_layer is not None:
            return self._rpc_layer
        config = _load(self._environ)
        return None if config is None else config.rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:  # type: ignore[override]
        """The `environment` argument, else `TF_CONFIG`'s `environment`, else `None`."""
        if self._environment is not None:
            return self._environment
        config = _load(self._environ)
        return None if config is None else config.environment


@dataclasses.dataclass(frozen=True)
class _Config:
    """`TF_CONFIG`, parsed and checked."""

    cluster: ClusterSpec
    task_type: str | None
    task_id: int | None
    rpc_layer: str | None
    environment: str | None
    session_master: str | None


def _load(environ: Mapping[str, str]) -> _Config | None:
    """Parse and check `TF_CONFIG`; `None` when it is unset, blank or `{}`."""
    raw = environ.get(_VAR)
    if raw is None or not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}): "
            f"{_shorten(raw)}. Set it to a JSON object such as {_EXAMPLE}."
        ) from None
    if not isinstance(config, dict):
        raise ClusterConfigError(
            f"TF_CONFIG must be a JSON object; got {type(config).__name__} {_shorten(raw)}. "
            f"Set it to a JSON object such as {_EXAMPLE}."
        )
    if not config:
        # `{}`, as deployment templates often set it: no cluster, exactly as when unset (TF).
        return None
    if "cluster" not in config and not set(config) <= _KEYS_WITHOUT_CLUSTER:
        raise ClusterConfigError(
            f"TF_CONFIG has no 'cluster' key (its keys: {sorted(config)}). Describe the cluster "
            f"as in {_EXAMPLE}, or unset TF_CONFIG for a single worker."
        )
    cluster = config.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ClusterConfigError(
            f"TF_CONFIG 'cluster' must map job names to lists of 'host:port' addresses; got "
            f"{cluster!r}. Write it as in {_EXAMPLE}."
        )
    try:
        spec = ClusterSpec(cluster)
    except ClusterConfigError as err:
        raise type(err)(f"TF_CONFIG 'cluster': {err}") from None
    for job in spec.jobs:
        for index in spec.task_indices(job):
            split_address(
                spec.task_address(job, index), variable=f"TF_CONFIG cluster {job!r}[{index}]"
            )
    task = config.get("task", {})
    if not isinstance(task, dict):
        raise ClusterConfigError(
            f'TF_CONFIG \'task\' must be an object like {{"type": "worker", "index": 0}}; got '
            f"{task!r}."
        )
    task_type = task.get("type")
    if task_type is not None and not isinstance(task_type, str):
        raise ClusterConfigError(
            f'TF_CONFIG task.type is {task_type!r}; it must be a job name string such as "worker".'
        )
    index = task.get("index")
    task_id = None if index is None else _task_index(index, "TF_CONFIG task.index")
    return _Config(
        cluster=spec,
        task_type=task_type,
        task_id=task_id,
        rpc_layer=_optional_str(config, "rpc_layer"),
        environment=_optional_str(config, "environment"),
        session_master=_optional_str(config, "session_master"),
    )


def _check_task(
    cluster: ClusterSpec,
    task_type: str | None,
    task_id: int | None,
    type_source: str,
    id_source: str,
) -> None:
    """Check that the task is one of the cluster (an evaluator may stand outside it)."""
    if task_type is None:
        return
    if task_id is None:
        raise ClusterConfigError(
            f'{type_source} is {task_type!r} but no task index is set. Add "index" to '
            f'TF_CONFIG\'s task, e.g. {{"type": {json.dumps(task_type)}, "index": 0}}, or pass '
            f"task_id."
        )
    if task_type not in cluster.jobs:
        if task_type in _OUTSIDE_CLUSTER_TASK_TYPES:
            return
        raise ClusterConfigError(
            f"{type_source} is {task_type!r}, which is not a job of TF_CONFIG's cluster; its "
            f"jobs are {cluster.jobs}. Use one of those, or add a {task_type!r} job to the "
            f"cluster."
        )
    indices = cluster.task_indices(task_type)
    if task_id not in indices:
        size = cluster.num_tasks(task_type)
        raise ClusterConfigError(
            f"{id_source} is {task_id}, past the end of job {task_type!r}, which has {size} "
            f"task(s) (indices {indices}). Use an index of that job or add tasks to it."
        )


def _task_index(value: Any, source: str) -> int:
    """A task index: a non-negative int, or a string of digits (TensorFlow calls `int()`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    raise ClusterConfigError(
        f"{source} is {value!r}; a task index is a non-negative integer such as 0."
    )


def _optional_str(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if value is not None and not isinstance(value, str):
        raise ClusterConfigError(
            f"TF_CONFIG {key!r} is {value!r} ({type(value).__name__}); it must be a string, "
            f'e.g. "rpc_layer": "grpc".'
        )
    return value


def _shorten(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
