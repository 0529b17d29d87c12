"""Start real worker processes for multi-process tests, collect their results, leave none behind.

`run_workers` runs one script in one fresh `python` per environment, each in its own process
group, waits for all of them under one deadline and kills every group it started before it
returns, on success, timeout, error or Ctrl-C alike. Workers hand a value back with `report`
(nbdist.testing.results). Imports only the standard library and nbdist.testing.results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nbdist.errors import ArgumentTypeError, InvalidArgumentError
from nbdist.testing import results as _results
from nbdist.testing.results import RESULT_ENV

__all__ = ["WorkerResult", "assert_all_ok", "run_workers", "worker_env"]

_STRIPPED_NAMES = frozenset(
    {
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TF_CONFIG", RESULT_ENV,
    }
)  # fmt: skip
_STRIPPED_PREFIXES = ("MASTER_", "SLURM_", "TORCHELASTIC_")
_WORKER_DEFAULTS = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
_POLL_S = 0.01
_TERM_GRACE_S = 2.0
_STDERR_TAIL = 40

# `python -c _WRAPPER <results.py> <code file>`: load results.py by path (not nbdist, so not
# torch) and let it run the code file as __main__ with `report` predefined.
_WRAPPER = (
    "import importlib.util as u, sys; "
    "s = u.spec_from_file_location('_nbdist_testing_results', sys.argv[1]); "
    "m = sys.modules[s.name] = u.module_from_spec(s); s.loader.exec_module(m); "
    "m._run_worker(sys.argv[2])"
)


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """What one worker process did.

    Attributes:
        rank: Index of the worker's environment in the `envs` given to `run_workers`.
        returncode: Exit status; negative for a signal (`-15` SIGTERM, `-9` SIGKILL).
        stdout: Everything the worker wrote to stdout.
        stderr: Everything the worker wrote to stderr (tracebacks; stack dumps on timeout).
        result: The object the worker passed to `report` last, as decoded JSON; None if none.
        reported: Whether the worker called `report` at all.
        elapsed: Seconds from the start of the run (when the deadline began) until the
            process was seen to exit (or was killed).
        timed_out: The worker still ran at the deadline and was killed.
        pid: The worker's process id (gone by the time you read this).
    """

    rank: int
    returncode: int
    stdout: str
    stderr: str
    result: Any
    reported: bool
    elapsed: float
    timed_out: bool
    pid: int

    @property
    def ok(self) -> bool:
        """True when the worker exited with status 0 before the deadline."""
        return self.returncode == 0 and not self.timed_out

    def status(self) -> str:
        """A short account of how the worker ended, e.g. `"exited with returncode 1"`."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            how = f"killed by {name} (returncode {self.returncode})"
        else:
            how = f"exited with returncode {self.returncode}"
        if self.timed_out:
            how = f"timed out, then {how}"
        return f"{how} after {self.elapsed:.1f}s"


@dataclasses.dataclass
class _Worker:
    rank: int
    popen: subprocess.Popen[bytes]
    out_path: str
    err_path: str
    result_path: str
    started: float
    ended: float | None = None
    timed_out: bool = False


def worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """Return the environment `run_workers` gives a worker: ours, cleaned, plus `extra`.

    Drops the rank variables a surrounding launcher may have set (`RANK`, `WORLD_SIZE`,
    `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_*`, `TF_CONFIG`, `SLURM_*`, `TORCHELASTIC_*`),
    adds `OMP_NUM_THREADS=1`, `GLOO_SOCKET_IFNAME=lo` and `PYTHONUNBUFFERED=1`, then `extra`,
    which wins over all of these.

    Example:
        >>> env = worker_env({"RANK": "1"})
        >>> env["RANK"], env["OMP_NUM_THREADS"], env["GLOO_SOCKET_IFNAME"]
        ('1', '1', 'lo')
    """
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _STRIPPED_NAMES and not name.startswith(_STRIPPED_PREFIXES)
    }
    env.update(_WORKER_DEFAULTS)
    for name, value in extra.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ArgumentTypeError(
                f"Worker environments map str to str, got {name!r}: {value!r} "
                f"({type(value).__name__}); write the value as str(value)."
            )
        env[name] = value
    return env


def run_workers(
    code: str,
    envs: Sequence[Mapping[str, str]],
    *,
    timeout: float = 60,
    cwd: str | os.PathLike[str] | None = None,
    fail_fast: bool = False,
) -> list[WorkerResult]:
    """Run `code` in one new Python process per environment and return how each ended.

    Each worker runs `sys.executable` in its own process group with `worker_env(envs[i])`.
    `code` is a script (dedented first); it hands a value back with `report(obj)`, predefined
    in its globals (or `from nbdist.testing import report`). All workers share one deadline,
    `timeout` seconds after the start: workers still running then are marked `timed_out`,
    sent SIGTERM (which dumps their stacks to stderr) and SIGKILL 2 s later. Whatever
    happens, including Ctrl-C, every process group started is killed and reaped before this
    returns or raises. A failing worker does not raise here; see `assert_all_ok`.

    Args:
        code: Python source each worker runs as `__main__`.
        envs: One mapping of extra environment variables per worker, e.g. from `torchrun_env`.
        timeout: Seconds all workers together may take.
        cwd: Working directory of the workers; defaults to ours.
        fail_fast: Kill the other workers as soon as one exits with a non-zero status, rather
            than letting them wait for a dead peer until the deadline. They are not marked
            `timed_out`; their returncode is negative.

    Returns:
        One `WorkerResult` per environment, in order.

    Example:
        >>> code = "import os; report(int(os.environ['RANK']) * 10)"
        >>> [r.result for r in run_workers(code, [{"RANK": "0"}, {"RANK": "1"}])]
        [0, 10]
    """
    if isinstance(envs, Mapping) or not envs:
        raise InvalidArgumentError(
            "run_workers needs a non-empty list with one environment mapping per worker, "
            "e.g. [torchrun_env(r, 2, port) for r in range(2)]."
        )
    if not timeout > 0:
        raise InvalidArgumentError(
            f"timeout must be a positive number of seconds, got {timeout!r}."
        )
    full_envs = [worker_env(extra) for extra in envs]  # raises before anything starts
    with tempfile.TemporaryDirectory(prefix="nbdist-workers-") as tmp:
        code_path = os.path.join(tmp, "worker_code.py")
        with open(code_path, "w", encoding="utf-8") as file:
            file.write(textwrap.dedent(code))
        workers: list[_Worker] = []
        try:
            started = time.monotonic()  # every worker's elapsed counts from here, as the deadline
            deadline = started + timeout
            for rank, env in enumerate(full_envs):
                workers.append(_start(rank, env, tmp, code_path, cwd, started))
            _wait(workers, deadline, fail_fast)
        finally:
            _kill_all(workers)
        return [_collect(worker) for worker in workers]


def _start(
    rank: int,
    env: dict[str, str],
    tmp: str,
    code_path: str,
    cwd: str | os.PathLike[str] | None,
    started: float,
) -> _Worker:
    prefix = os.path.join(tmp, f"worker{rank}")
    env[RESULT_ENV] = prefix + ".json"
    argv = [sys.executable, "-c", _WRAPPER, os.path.abspath(_results.__file__), code_path]
    with open(prefix + ".out", "wb") as out, open(prefix + ".err", "wb") as err:
        popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    return _Worker(rank, popen, prefix + ".out", prefix + ".err", prefix + ".json", started)


def _wait(workers: list[_Worker], deadline: float, fail_fast: bool) -> None:
    pending = list(workers)
    while True:
        now = time.monotonic()
        for worker in list(pending):
            if worker.popen.poll() is not None:
                worker.ended = now
                pending.remove(worker)
                if fail_fast and worker.popen.returncode != 0:
                    return
        if not pending:
            return
        if now >= deadline:
            for worker in pending:
                worker.timed_out = True
            return
        time.sleep(min(_POLL_S, deadline - now))


def _signal_group(worker: _Worker, sig: signal.Signals) -> None:
    # The group id is the leader's pid (start_new_session); Linux does not reuse that number
    # while any process of the group is left, even after the leader is reaped.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.popen.pid, sig)


def _kill_all(workers: list[_Worker]) -> None:
    alive = [worker for worker in workers if worker.popen.poll() is None]
    for worker in alive:
        _signal_group(worker, signal.SIGTERM)
    interrupted: KeyboardInterrupt | None = None
    try:
        grace_end = time.monotonic() + _TERM_GRACE_S
        while alive and time.monotonic() < grace_end:
            time.sleep(_POLL_S)
            alive = [worker for worker in alive if worker.popen.poll() is None]
    except KeyboardInterrupt as err:  # a second Ctrl-C skips the grace period, not the kill
        interrupted = err
    for worker in workers:
        _signal_group(worker, signal.SIGKILL)  # also whatever a finished worker left behind
    now = time.monotonic()
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.popen.wait(timeout=10)  # only a process stuck in the kernel outlasts SIGKILL
        if worker.ended is None:
            worker.ended = now
    if interrupted is not None:
        raise interrupted


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as file:
            return file.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _collect(worker: _Worker) -> WorkerResult:
    reported, result = False, None
    try:
        with open(worker.result_path, encoding="utf-8") as file:
            result, reported = json.load(file), True
    except (FileNotFoundError, ValueError):
        pass
    returncode = worker.popen.returncode
    return WorkerResult(
        rank=worker.rank,
        returncode=-signal.SIGKILL if returncode is None else returncode,
        stdout=_read_text(worker.out_path),
        stderr=_read_text(worker.err_path),
        result=result,
        reported=reported,
        elapsed=(worker.ended or time.monotonic()) - worker.started,
        timed_out=worker.timed_out,
        pid=worker.popen.pid,
    )


def assert_all_ok(results: Sequence[WorkerResult]) -> None:
    """Raise AssertionError naming every worker that failed or timed out, with its stderr tail.

    Args:
        results: What `run_workers` returned.

    Raises:
        AssertionError: Some worker exited non-zero or timed out. The message gives each
            failing worker's rank, returncode and the last 40 lines of its stderr.

    Example:
        >>> assert_all_ok(run_workers("pass", [{}, {}]))
    """
    failed = [result for result in results if not result.ok]
    if not failed:
        return
    lines = [f"{len(failed)} of {len(results)} workers failed."]
    for result in failed:
        tail = result.stderr.rstrip("\n").splitlines()[-_STDERR_TAIL:]
        lines.append(
            f"--- worker {result.rank} (pid {result.pid}) {result.status()}; "
            f"last {len(tail)} lines of stderr:"
        )
        lines.extend(tail or ["(stderr is empty)"])
    if any(result.timed_out for result in failed):
        lines.append(
            "A worker that timed out may be waiting for a peer that failed (look at the other "
            "workers first), or the timeout is too short for the work: raise timeout=."
        )
    raise AssertionError("\n".join(lines))
