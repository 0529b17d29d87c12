"""`ClusterSpec`: a cluster as jobs of tasks, each an address (TF's `tf.train.ClusterSpec`).

Example:
    >>> spec = ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]})
    >>> spec.jobs, spec.num_tasks("worker"), spec.task_address("ps", 0)
    (['worker', 'ps'], 2, 'p0:2222')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbdist.cluster_resolver._errors import ClusterTypeError
from nbdist.errors import ClusterConfigError

__all__ = ["ClusterSpec"]

_EXAMPLE = '{"worker": ["host0:2222", "host1:2222"], "ps": {0: "host2:2222"}}'


class ClusterSpec:
    """The tasks of a cluster, grouped into jobs, as TensorFlow's `tf.train.ClusterSpec`.

    A job's tasks are either a list of addresses (task `i` is the `i`-th entry) or a sparse
    mapping from task index to address, which lets a task be configured without knowing every
    other task of its job. Addresses are not checked here (`"localhost:0"` is a valid address
    for a local server); the resolvers check the ports they read from the environment.

    Args:
        cluster: a dict `{job: [address, ...]}` or `{job: {index: address}}`, or another
            `ClusterSpec` (copied, with its jobs in sorted order, as TensorFlow does).

    Raises:
        ClusterConfigError: (also a `TypeError`) `cluster` is not a dict or a `ClusterSpec`, a
            job's tasks are not a list or a dict, or a job name or an address is not a string;
            (a `ValueError`) a task index is not a non-negative integer.

    Example:
        >>> sparse = ClusterSpec({"worker": {1: "w1:2222"}, "ps": ["p0:2222", "p1:2222"]})
        >>> sparse.job_tasks("worker"), sparse.task_indices("worker")
        ([None, 'w1:2222'], [1])
        >>> sparse.as_dict()
        {'worker': {1: 'w1:2222'}, 'ps': ['p0:2222', 'p1:2222']}
    """

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type, compared by content

    def __init__(self, cluster: Mapping[str, Any] | ClusterSpec):
        if isinstance(cluster, ClusterSpec):
            other: ClusterSpec = cluster
            self._jobs: dict[str, dict[int, str]] = {
                job: dict(other._jobs[job]) for job in sorted(other._jobs)
            }
            return
        if not isinstance(cluster, Mapping):
            raise ClusterTypeError(
                f"ClusterSpec needs a dict from job names to task addresses; got "
                f"{type(cluster).__name__} {cluster!r}. Pass for example {_EXAMPLE}."
            )
        self._jobs = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str):
                raise ClusterTypeError(
                    f"ClusterSpec job names must be strings; got {type(job).__name__} {job!r}. "
                    f"Name jobs like 'worker', 'chief' or 'ps'."
                )
            self._jobs[job] = _job_tasks_from(job, tasks)

    # -- queries -------------------------------------------------------------------------------

    @property
    def jobs(self) -> list[str]:
        """The job names, in the order given (sorted when copied from another `ClusterSpec`).

        Example:
            >>> ClusterSpec({"chief": ["c:1"], "worker": ["w:1"]}).jobs
            ['chief', 'worker']
        """
        return list(self._jobs)

    def num_tasks(self, job_name: str) -> int:
        """The number of tasks defined in `job_name` (for a sparse job, the defined ones).

        Raises:
            ClusterConfigError: (a `ValueError`) `job_name` is not a job of this cluster.

        Example:
            >>> ClusterSpec({"worker": {0: "w0:1", 5: "w5:1"}}).num_tasks("worker")
            2
        """
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """The task indices defined in `job_name`, sorted.

        Raises:
            ClusterConfigError: (a `ValueError`) `job_name` is not a job of this cluster.

        Example:
            >>> ClusterSpec({"worker": {3: "w3:1", 1: "w1:1"}}).task_indices("worker")
            [1, 3]
        """
        return sorted(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task `task_index` of job `job_name`.

        Raises:
            ClusterConfigError: (a `ValueError`) no such job, or no such task in that job; the
                message lists the valid ones.

        Example:
            >>> ClusterSpec({"worker": ["w0:2222", "w1:2222"]}).task_address("worker", 1)
            'w1:2222'
        """
        tasks = self._job(job_name)
        try:
            return tasks[task_index]
        except (KeyError, TypeError):
            raise ClusterConfigError(
                f"Job {job_name!r} has no task with index {task_index!r}; its task indices are "
                f"{sorted(tasks)}. Use one of those indices."
            ) from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """The addresses of `job_name` as a list indexed by task index.

        As in TensorFlow, a sparse job gives `None` at the indices it does not define, so the
        list's length is one more than the largest index, not `num_tasks(job_name)`.

        Raises:
            ClusterConfigError: (a `ValueError`) `job_name` is not a job of this cluster.

        Example:
            >>> ClusterSpec({"worker": {0: "w0:1", 2: "w2:1"}}).job_tasks("worker")
            ['w0:1', None, 'w2:1']
        """
        tasks = self._job(job_name)
        result: list[str | None] = [None] * (max(tasks) + 1 if tasks else 0)
        for index, address in tasks.items():
            result[index] = address
        return result

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """A dict from job name to its tasks: a list where the indices are dense, else a dict.

        Example:
            >>> ClusterSpec({"worker": {0: "w0:1", 1: "w1:1"}, "ps": {2: "p2:1"}}).as_dict()
            {'worker': ['w0:1', 'w1:1'], 'ps': {2: 'p2:1'}}
        """
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._jobs.items():
            if tasks and max(tasks) + 1 == len(tasks):
                result[job] = [tasks[i] for i in range(len(tasks))]
            else:
                result[job] = {i: tasks[i] for i in sorted(tasks)}
        return result

    # -- value behaviour -----------------------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._jobs == other._jobs
        if isinstance(other, Mapping):
            try:
                return self._jobs == ClusterSpec(other)._jobs
            except (ClusterConfigError, TypeError):
                return False
        return NotImplemented

    def __repr__(self) -> str:
        as_dict = self.as_dict()
        items = ", ".join(f"{job!r}: {as_dict[job]!r}" for job in sorted(as_dict))
        return f"ClusterSpec({{{items}}})"

    # -- internals -----------------------------------------------------------------------------

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._jobs[job_name]
        except (KeyError, TypeError):
            raise ClusterConfigError(
                f"No job {job_name!r} in this cluster; its jobs are {self.jobs}. "
                f"Use one of those job names."
            ) from None


def _job_tasks_from(job: str, tasks: Any) -> dict[int, str]:
    """Normalise one job's tasks (a list or a sparse dict) to `{index: address}`."""
    if isinstance(tasks, (list, tuple)):
        result = dict(enumerate(tasks))
    elif isinstance(tasks, Mapping):
        result = {_task_index(job, index): address for index, address in tasks.items()}
    else:
        raise ClusterTypeError(
            f"The tasks of job {job!r} must be a list of addresses or a dict from task index "
            f"to address; got {type(tasks).__name__} {tasks!r}. Write e.g. "
            f"{{{job!r}: ['host0:2222', 'host1:2222']}}."
        )
    for index, address in result.items():
        if not isinstance(address, str):
            raise ClusterTypeError(
                f"Task {index} of job {job!r} has address {address!r} "
                f"({type(address).__name__}); addresses are strings like 'host0:2222'."
            )
    return result


def _task_index(job: str, index: Any) -> int:
    """A sparse job's key as a task index: an int, or a string of digits as JSON writes it."""
    if isinstance(index, bool):
        value = None
    elif isinstance(index, int):
        value = index
    elif isinstance(index, str) and index.strip().isdecimal():
        value = int(index)
    else:
        value = None
    if value is None or value < 0:
        raise ClusterConfigError(
            f"Job {job!r} has task index {index!r}; task indices are non-negative integers "
            f"(or strings of digits, as JSON keys). Write e.g. {{{job!r}: {{0: 'host0:2222'}}}}."
        )
    return value
