"""`SlurmClusterResolver`: the cluster of a Slurm job step, from Slurm's variables (as TF's).

Slurm describes a step by `SLURM_PROCID` (this task's rank), `SLURM_STEP_NUM_TASKS`,
`SLURM_STEP_NODELIST` (compressed: `node[1-3,7]`) and `SLURM_STEP_TASKS_PER_NODE` (compressed:
`2(x3),1`); outside `srun` the job-level `SLURM_NTASKS`, `SLURM_JOB_NODELIST` and
`SLURM_TASKS_PER_NODE` are read instead.

Example:
    >>> expand_hostlist("n[01-03],gpu[7,9]")
    ['n01', 'n02', 'n03', 'gpu7', 'gpu9']
    >>> expand_tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from nbdist.cluster_resolver._errors import ClusterRuntimeError
from nbdist.cluster_resolver.base import (
    ClusterResolver,
    format_address,
    format_master_url,
    whole_number,
)
from nbdist.cluster_resolver.cluster_spec import ClusterSpec
from nbdist.errors import ClusterConfigError

__all__ = ["SlurmClusterResolver", "expand_hostlist", "expand_tasks_per_node"]

_NUM_TASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
_TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASK_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class SlurmClusterResolver(ClusterResolver):
    """A cluster resolver for a Slurm job step (TF's `SlurmClusterResolver`).

    Tasks are packed onto the step's nodes in node-list order, as Slurm's default (block)
    distribution places ranks: rank `r` is the `r`-th task slot. A node's `k`-th task listens
    on `port_base + k` and gets GPUs `k*gpus_per_task … (k+1)*gpus_per_task - 1`. Ranks are
    then dealt to the jobs in sorted job-name order (`"ps"` before `"worker"`), as TensorFlow
    does. `task_type` and `task_id` are known as soon as the resolver is built (TensorFlow
    sets them in `cluster_spec()`), and a value you assign to them is kept.

    Args:
        jobs: `{job name: number of tasks}`; default `{"worker": <tasks in the step>}`.
        port_base: the port of the first task on each node.
        gpus_per_node: GPUs on each node; default: the entries of `CUDA_VISIBLE_DEVICES`, else
            `torch.cuda.device_count()`.
        gpus_per_task: GPUs per task; default: `gpus_per_node // <most tasks on a node>`.
        tasks_per_node: an int (the same on every node), a dict `{host: tasks}`, or `None` to
            read `SLURM_STEP_TASKS_PER_NODE`.
        auto_set_gpu: set `CUDA_VISIBLE_DEVICES` to this task's GPUs at each `cluster_spec()`
            call (not when a task gets no GPU).
        rpc_layer: the protocol prefix of `master()`.
        environ: the environment to read and, with `auto_set_gpu`, to write (default
            `os.environ`); beyond TensorFlow, for tests and `resolve_cluster(environ)`.

    Raises:
        ClusterConfigError: (a `ValueError`) a Slurm variable or an argument is malformed (the
            message names it); (also a `RuntimeError`, as in TensorFlow) a needed Slurm variable
            is missing, more GPUs are requested than a node has, or `jobs` asks for a different
            number of tasks than the step has.

    Example:
        >>> env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "5",
        ...        "SLURM_STEP_NODELIST": "t02n[13,41,43]", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}
        >>> resolver = SlurmClusterResolver(jobs={"ps": 1, "worker": 4}, gpus_per_node=2,
        ...                                 auto_set_gpu=False, environ=env)
        >>> for job, tasks in resolver.cluster_spec().as_dict().items():
        ...     print(job, tasks)
        ps ['t02n13:8888']
        worker ['t02n13:8889', 't02n41:8888', 't02n41:8889', 't02n43:8888']
        >>> resolver.get_task_info(), resolver.master(), resolver.num_accelerators()
        (('worker', 0), 'grpc://t02n13:8889', {'GPU': 1})
    """

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        gpus_per_node: int | None = None,
        gpus_per_task: int | None = None,
        tasks_per_node: int | Mapping[str, int] | None = None,
        auto_set_gpu: bool = True,
        rpc_layer: str | None = "grpc",
        *,
        environ: MutableMapping[str, str] | None = None,
    ):
        self._environ = os.environ if environ is None else environ
        env = self._environ
        self._rank = _int(_required(env, ("SLURM_PROCID",), "")[1], "SLURM_PROCID", minimum=0)
        if jobs is None:
            name, value = _required(env, _NUM_TASKS_VARS, ", or pass jobs=")
            jobs = {"worker": _int(value, name, minimum=1)}
        self._jobs = _check_jobs(jobs)
        self._port_base = _int(port_base, "port_base", minimum=1)
        self._slots = _task_slots(env, tasks_per_node)
        most_on_a_node = max(count for _, count in self._slots)
        num_tasks = sum(count for _, count in self._slots)

        if gpus_per_node is None:
            gpus_per_node = _visible_gpus(env)
        self._gpus_per_node = _int(gpus_per_node, "gpus_per_node", minimum=0)
        if gpus_per_task is None:
            gpus_per_task = self._gpus_per_node // max(most_on_a_node, 1)
        self._gpus_per_task = _int(gpus_per_task, "gpus_per_task", minimum=0)
        self._auto_set_gpu = auto_set_gpu
        self._rpc_layer = rpc_layer

        if most_on_a_node * self._gpus_per_task > self._gpus_per_node:
            raise ClusterRuntimeError(
                f"Requested more GPUs per node than available: {most_on_a_node} task(s) on a "
                f"node × gpus_per_task={self._gpus_per_task} needs "
                f"{most_on_a_node * self._gpus_per_task} GPUs, but gpus_per_node is "
                f"{self._gpus_per_node}. Lower gpus_per_task or the tasks per node."
            )
        if sum(self._jobs.values()) != num_tasks:
            raise ClusterRuntimeError(
                f"jobs {dict(self._jobs)} ask for {sum(self._jobs.values())} task(s) but the "
                f"Slurm step has {num_tasks}. Make the job sizes add up to {num_tasks}, or "
                f"launch the step with that many tasks (srun --ntasks=...)."
            )
        if self._rank >= num_tasks:
            raise ClusterConfigError(
                f"SLURM_PROCID is {self._rank} but the step has only {num_tasks} task(s) "
                f"(ranks 0..{num_tasks - 1}). Check SLURM_PROCID and the tasks per node."
            )
        last_port = self._port_base + most_on_a_node - 1
        if last_port > 65535:
            raise ClusterConfigError(
                f"port_base={self._port_base} with {most_on_a_node} task(s) on a node needs "
                f"ports up to {last_port}, past 65535. Choose port_base <= "
                f"{65536 - most_on_a_node}."
            )
        self._task_type, self._task_id = self._own_task()

    # -- the cluster ---------------------------------------------------------------------------

    def cluster_spec(self) -> ClusterSpec:
        """The step's cluster; with `auto_set_gpu`, also sets `CUDA_VISIBLE_DEVICES` (as TF).

        Example:
            >>> env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "3",
            ...        "SLURM_STEP_NODELIST": "t02n13,t02n41,t02n43"}
            >>> SlurmClusterResolver(jobs={"ps": 1, "worker": 2}, tasks_per_node=1,
            ...                      gpus_per_node=0, environ=env).cluster_spec().as_dict()
            {'ps': ['t02n13:8888'], 'worker': ['t02n41:8888', 't02n43:8888']}
        """
        cluster, gpus = self._layout()
        if self._auto_set_gpu and self._gpus_per_task > 0:
            self._environ["CUDA_VISIBLE_DEVICES"] = gpus[self._rank]
        return cluster

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The given task's address (default: this task's), with the rpc layer; `""` if unknown.

        Example:
            >>> env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "a,b",
            ...        "SLURM_TASKS_PER_NODE": "1(x2)"}
            >>> resolver = SlurmClusterResolver(gpus_per_node=0, environ=env)
            >>> resolver.master(), resolver.master("worker", 1, rpc_layer="test")
            ('grpc://a:8888', 'test://b:8888')
        """
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)

    def get_task_info(self) -> tuple[str | None, int | None]:
        """`(task_type, task_id)` of this process."""
        return self.task_type, self.task_id

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """`{"GPU": gpus_per_task}`, as TensorFlow reports it (also when that is 0)."""
        del task_type, task_id, config_proto
        return {"GPU": self._gpus_per_task}

    # -- internals -----------------------------------------------------------------------------

    def _own_task(self) -> tuple[str, int]:
        """The job and index of this process's rank (ranks are dealt to sorted job names)."""
        owners = [(job, index) for job in sorted(self._jobs) for index in range(self._jobs[job])]
        return owners[self._rank]  # the rank was checked against the number of tasks

    def _layout(self) -> tuple[ClusterSpec, list[str]]:
        """The cluster, and each rank's GPU list."""
        addresses: list[str] = []
        gpus: list[str] = []
        for host, count in self._slots:
            for local in range(count):
                port = self._port_base + local
                addresses.append(format_address(host, port, variable="port_base"))
                first = local * self._gpus_per_task
                gpus.append(",".join(str(g) for g in range(first, first + self._gpus_per_task)))
        cluster: dict[str, list[str]] = {}
        start = 0
        for job in sorted(self._jobs):
            cluster[job] = addresses[start : start + self._jobs[job]]
            start += self._jobs[job]
        return ClusterSpec(cluster), gpus


def expand_hostlist(hostlist: str, *, variable: str = "the host list") -> list[str]:
    """Expand a Slurm host list such as `n[1-3,7],m5` in order, without removing duplicates.

    Zero padding is kept (`n[01-03]` gives `n01 n02 n03`), commas inside brackets belong to
    the range, and several brackets in one name expand as a product (`r[1-2]n[1-2]`).

    Args:
        hostlist: the compressed list.
        variable: the variable it came from, named in errors.

    Raises:
        ClusterConfigError: (a `ValueError`) empty names, unbalanced or nested brackets, or a
            range that is not `lo-hi` with `lo <= hi`.

    Example:
        >>> expand_hostlist("n[1-2],m5,o[3-4,6,7-9]")
        ['n1', 'n2', 'm5', 'o3', 'o4', 'o6', 'o7', 'o8', 'o9']
        >>> expand_hostlist("n[0001-0003],o[009-011]")
        ['n0001', 'n0002', 'n0003', 'o009', 'o010', 'o011']
    """
    if not isinstance(hostlist, str) or not hostlist.strip():
        raise _hostlist_error(hostlist, variable, "it is empty")
    hosts: list[str] = []
    for part in _split_outside_brackets(hostlist, variable):
        pieces = re.split(r"\[([^\[\]]*)\]", part)  # literal, range, literal, range, …, literal
        choices = [
            [piece] if i % 2 == 0 else _expand_ranges(piece, hostlist, variable)
            for i, piece in enumerate(pieces)
        ]
        hosts.extend("".join(combination) for combination in itertools.product(*choices))
    return hosts


def expand_tasks_per_node(tasks_per_node: str, *, variable: str = "tasks per node") -> list[int]:
    """Expand Slurm's tasks-per-node list such as `2(x3),1` into one count per node.

    Args:
        tasks_per_node: the compressed list.
        variable: the variable it came from, named in errors.

    Raises:
        ClusterConfigError: (a `ValueError`) an entry that is not `N` or `N(xM)`.

    Example:
        >>> expand_tasks_per_node("3(x2),2,11(x4)")
        [3, 3, 2, 11, 11, 11, 11]
    """
    counts: list[int] = []
    entries = tasks_per_node.split(",") if isinstance(tasks_per_node, str) else [None]
    for entry in entries:
        match = _TASK_COUNT.fullmatch(entry.strip()) if entry is not None else None
        if match is None or int(match.group(2) or 1) < 1:
            raise ClusterConfigError(
                f"{variable} is {tasks_per_node!r}; entry {entry!r} is not a task count 'N' or "
                f"'N(xM)' (N tasks on each of M nodes). Expected e.g. '2(x3),1'."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


# -- helpers -----------------------------------------------------------------------------------


def _split_outside_brackets(hostlist: str, variable: str) -> list[str]:
    parts, current, inside = [], "", False
    for char in hostlist:
        if char == "[":
            if inside:
                raise _hostlist_error(hostlist, variable, "it has a '[' inside brackets")
            inside = True
        elif char == "]":
            if not inside:
                raise _hostlist_error(hostlist, variable, "it has a ']' without '['")
            inside = False
        elif char == "," and not inside:
            parts.append(current)
            current = ""
            continue
        current += char
    if inside:
        raise _hostlist_error(hostlist, variable, "a '[' is never closed")
    parts.append(current)
    for part in parts:
        if not part.strip() or any(c.isspace() for c in part):
            raise _hostlist_error(hostlist, variable, f"it has an empty or blank name {part!r}")
    return parts


def _expand_ranges(ranges: str, hostlist: str, variable: str) -> list[str]:
    values: list[str] = []
    for item in ranges.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise _hostlist_error(hostlist, variable, f"range {item!r} is not 'N' or 'LO-HI'")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(low) > int(high):
            raise _hostlist_error(hostlist, variable, f"range {item!r} runs backwards")
        values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return values


def _hostlist_error(hostlist: Any, variable: str, problem: str) -> ClusterConfigError:
    return ClusterConfigError(
        f"{variable} is {hostlist!r}, which is not a Slurm host list: {problem}. Expected "
        f"names and bracketed ranges such as 'node[1-3,7],gpu[01-04]'."
    )


def _required(env: Mapping[str, str], names: tuple[str, ...], fix: str) -> tuple[str, str]:
    """The first of `names` that is set, and its value."""
    for name in names:
        if name in env:
            return name, env[name]
    raise ClusterRuntimeError(
        f"{' and '.join(names)} {'are' if len(names) > 1 else 'is'} not set: not running "
        f"inside a Slurm job step? Launch the workers with srun{fix}."
    )


def _int(value: Any, name: str, *, minimum: int) -> int:
    number = whole_number(value)
    if number is None or number < minimum:
        raise ClusterConfigError(
            f"{name} is {value!r}; it must be an integer >= {minimum}. Check how the job was "
            f"launched or what was passed to SlurmClusterResolver."
        )
    return number


def _check_jobs(jobs: Any) -> dict[str, int]:
    if not isinstance(jobs, Mapping) or not jobs:
        raise ClusterConfigError(
            f"jobs is {jobs!r}; it must be a non-empty dict from job name to number of tasks, "
            f"e.g. {{'ps': 1, 'worker': 4}}."
        )
    checked = {}
    for job, count in jobs.items():
        if not isinstance(job, str) or not job:
            raise ClusterConfigError(
                f"jobs has the job name {job!r}; job names are non-empty strings such as 'worker'."
            )
        checked[job] = _int(count, f"jobs[{job!r}]", minimum=0)
    return checked


def _task_slots(env: Mapping[str, str], tasks_per_node: Any) -> list[tuple[str, int]]:
    """`(host, number of tasks)` for each node of the step, in node-list order."""
    if isinstance(tasks_per_node, Mapping):
        slots = [
            (host, _int(n, f"tasks_per_node[{host!r}]", minimum=0))
            for host, n in tasks_per_node.items()
        ]
    else:
        list_var, raw_hosts = _required(
            env, _NODELIST_VARS, ", or pass tasks_per_node={host: tasks}"
        )
        hosts = expand_hostlist(raw_hosts, variable=list_var)
        if tasks_per_node is not None:
            counts = [_int(tasks_per_node, "tasks_per_node", minimum=1)] * len(hosts)
        else:
            counts_var, raw_counts = _required(
                env, _TASKS_PER_NODE_VARS, ", or pass tasks_per_node="
            )
            counts = expand_tasks_per_node(raw_counts, variable=counts_var)
            if len(counts) != len(hosts):
                raise ClusterConfigError(
                    f"{list_var}={raw_hosts!r} names {len(hosts)} node(s) but "
                    f"{counts_var}={raw_counts!r} gives task counts for {len(counts)}. They must "
                    f"describe the same nodes; pass tasks_per_node= to override."
                )
        duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
        if duplicates:
            raise ClusterConfigError(
                f"{list_var}={raw_hosts!r} names node(s) {duplicates} more than once. List each "
                f"node once and put its task count in the tasks per node."
            )
        slots = list(zip(hosts, counts))
    if not slots or max(count for _, count in slots) == 0:
        raise ClusterConfigError(
            f"The Slurm step has no task on any node (nodes and task counts: {slots}). Give at "
            f"least one node with one task or more (tasks_per_node=...)."
        )
    return slots


def _visible_gpus(env: Mapping[str, str]) -> int:
    """The GPUs of this node: `CUDA_VISIBLE_DEVICES`' entries, else what torch counts."""
    if "CUDA_VISIBLE_DEVICES" in env:
        entries = [e.strip() for e in env["CUDA_VISIBLE_DEVICES"].split(",") if e.strip()]
        if entries and (entries[0].startswith("-") or entries[0] == "NoDevFiles"):
            return 0  # CUDA hides every device from the first invalid entry on
        return len(entries)
    import torch  # imported here: resolvers must not import torch when nbdist is imported

    return torch.cuda.device_count()
