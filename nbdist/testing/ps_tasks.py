"""Start the `ps` and `worker` tasks of a ParameterServerStrategy cluster as real processes
(`nd.Server` each, on 127.0.0.1), for tests and benchmarks; the caller's process is the chief.

`TaskProcesses` kills every process it started when its `with` block ends, whatever happened;
`kill(job, index)` sends SIGKILL to one task and `restart(job, index)` starts it again on the
same address.

Example (starts processes, so not run here)::

    with TaskProcesses(num_workers=2, num_ps=1) as tasks:
        strategy = nd.ParameterServerStrategy(tasks.spec)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from nbdist.testing.ports import free_ports
from nbdist.testing.processes import worker_env

__all__ = ["TaskProcesses"]

_CODE = (
    "import sys, nbdist as nd; "
    "nd.Server(nd.ClusterSpec({'worker': sys.argv[1].split(','), 'ps': sys.argv[2].split(',')}),"
    " sys.argv[3], int(sys.argv[4])).join()"
)


class TaskProcesses:
    """`num_workers` worker and `num_ps` ps task processes on free 127.0.0.1 ports."""

    def __init__(self, num_workers: int = 2, num_ps: int = 1, threads: int = 1):
        ports = free_ports(num_workers + num_ps + 1)
        self.workers = [f"127.0.0.1:{p}" for p in ports[:num_workers]]
        self.ps = [f"127.0.0.1:{p}" for p in ports[num_workers : num_workers + num_ps]]
        self.chief = f"127.0.0.1:{ports[-1]}"
        self.threads = threads
        self.procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self._logs = tempfile.TemporaryDirectory(prefix="nbdist-ps-")

    @property
    def spec(self) -> Any:
        """The cluster's `ClusterSpec` (chief, worker, ps)."""
        import nbdist as nd

        return nd.ClusterSpec({"chief": [self.chief], "worker": self.workers, "ps": self.ps})

    def start(self, job: str, index: int) -> subprocess.Popen[bytes]:
        """Start (or restart) task `/job:<job>/task:<index>`."""
        env = worker_env(
            {"OMP_NUM_THREADS": str(self.threads), "PYTHONPATH": os.pathsep.join(sys.path)}
        )
        log = open(os.path.join(self._logs.name, f"{job}{index}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CODE,
                ",".join(self.workers),
                ",".join(self.ps),
                job,
                str(index),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[(job, index)] = proc
        return proc

    def kill(self, job: str, index: int) -> None:
        """SIGKILL the task and reap it."""
        proc = self.procs[(job, index)]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def log(self, job: str, index: int) -> str:
        """What the task printed."""
        with open(os.path.join(self._logs.name, f"{job}{index}.log"), errors="replace") as f:
            return f.read()

    def __enter__(self) -> TaskProcesses:
        try:
            for i in range(len(self.ps)):
                self.start("ps", i)
            for i in range(len(self.workers)):
                self.start("worker", i)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every task process (its whole session) and wait for it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._logs.cleanup()

    def __exit__(self, *exc: Any) -> None:
        self.close()
