"""ipyparallel's ssh engine launchers, with a quiet stop and the hosts started at once.

`SSHStopEngineLauncher` is ipyparallel's `SSHEngineLauncher` whose `signal` tolerates an engine
that has already exited. ipyparallel's stop sends SIGTERM by running `os.kill(pid, sig)` in a
Python on the engine's host; nbdist's engines exit as soon as the controller stops them, so the
pid is often gone by then and the remote Python's `ProcessLookupError` traceback went to the
notebook's stderr (into the cell of `%dist stop` and `%dist restart`). Here the remote code
treats "no such process" as done and its stderr is captured; any other failure (ssh cannot
reach the host, permission denied) is logged as a warning with what the host said, and raised
as before (ipyparallel's stop then waits for the engine and kills it).

`ConcurrentSSHEngineSetLauncher` is ipyparallel's `SSHEngineSetLauncher` that starts all its
engines at the same time (one thread each). ipyparallel starts them one after another, and each
engine costs several ssh round trips and remote Pythons (shell check, `python --version`,
`ipython profile create`, the connection files, the start itself): 4 engines on 2 hosts took
most of a 30-75 s start on a loaded machine. A host's first engine sends the connection files;
its other engines do their checks meanwhile and start the engine once the files are there.

Imports ipyparallel: import it only when starting engines (`launchers.ipyparallel_settings`
names these classes by their path).

Example (as `launchers.ipyparallel_settings` does it)::

    ipyparallel.Cluster(engine_launcher_class=ConcurrentSSHEngineSetLauncher, ...)
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

from nbdist.cluster.errors import ClusterStartError, HostUnreachableError

__all__ = ["ConcurrentSSHEngineSetLauncher", "SSHStopEngineLauncher"]

_FILES_WAIT_S = 600
"""At most this long a host's other engines wait for its first to send the connection files
(the cluster's own start timeout ends the start before)."""

_GONE = "__nbdist_gone__"
"""What the remote kill prints when the process had already exited."""


def wait_code(pid: int, timeout: float | None) -> str:
    """The Python run on the engine's host to wait up to `timeout` s for `pid` to exit, printing
    what ipyparallel's `ssh_waitpid` prints, without importing anything but `os` and `time`
    (ipyparallel's imports ipyparallel there: a second or more of CPU per call, several calls
    per engine at each stop; Note [Light remote waits]).

    Example:
        >>> "__process_running=0__" in wait_code(123, 1.0)
        True
    """
    limit = "None" if timeout is None else repr(float(timeout))
    return (
        "import os, time\n"
        f"pid, limit = {int(pid)}, {limit}\n"
        "deadline = None if limit is None else time.monotonic() + limit\n"
        "while True:\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/stat') as stat:\n"
        "            gone = stat.read().rpartition(')')[2].split()[0] in ('Z', 'X')\n"
        "    except FileNotFoundError:\n"
        "        gone = True\n"
        "    except OSError:\n"
        "        try:\n"
        "            os.kill(pid, 0)\n"
        "            gone = False\n"
        "        except ProcessLookupError:\n"
        "            gone = True\n"
        "        except PermissionError:\n"
        "            gone = False\n"
        "    if gone:\n"
        "        print('__process_running=0__')\n"
        "        print('__exit_code=-1__')\n"
        "        break\n"
        "    if deadline is not None and time.monotonic() >= deadline:\n"
        "        print('__process_running=1__')\n"
        "        break\n"
        "    time.sleep(0.05)\n"
    )


def read_code(path: str, remove: bool) -> str:
    """The Python run on the engine's host to print its output file (and remove it): one ssh
    round trip, where ipyparallel's fetch takes three (a check that it exists, scp, rm).

    Example:
        >>> "os.remove" in read_code("/tmp/engine.log", remove=True)
        True
    """
    return (
        "import os, sys\n"
        f"path = {path!r}\n"
        "try:\n"
        "    with open(path, errors='replace') as file:\n"
        "        sys.stdout.write(file.read())\n"
        "except FileNotFoundError:\n"
        "    pass\n"
        + ("try:\n    os.remove(path)\nexcept OSError:\n    pass\n" if remove else "")
    )


def kill_code(pid: int, sig: int) -> str:
    """The Python run on the engine's host to signal `pid`: "no such process" is not an error.

    Example:
        >>> "ProcessLookupError" in kill_code(123, 15)
        True
    """
    return (
        "import os\n"
        "try:\n"
        f"    os.kill({int(pid)}, {int(sig)})\n"
        "except ProcessLookupError:\n"
        f"    print({_GONE!r})\n"
    )


class SSHStopEngineLauncher(SSHEngineLauncher):  # type: ignore[misc]
    """One engine on a host over ssh, whose stop is quiet when the engine already exited.

    `files_sent` (set by the engine set) is the event of the host's first engine: set once it
    has sent the connection files; the host's other engines wait for it before they start.
    """

    files_sent: threading.Event | None = None

    def send_files(self) -> None:
        """Send the connection files (the host's first engine), or wait until they are sent."""
        if self.to_send:
            try:
                super().send_files()
            finally:  # on a failure too: the others go on (and fail as the engine would)
                if self.files_sent is not None:
                    self.files_sent.set()
        elif self.files_sent is not None and not self.files_sent.wait(_FILES_WAIT_S):
            raise ClusterStartError(
                f"The connection files were not sent to {self.location} within {_FILES_WAIT_S} s "
                "(the host's first engine is still copying them, or ssh hangs there); check "
                "that scp reaches the host: launcher_options={'scp_args': [...]}."
            )

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited after `stop_seconds_until_kill`, as
        ipyparallel's stop, with each signal sent from a thread: ipyparallel sends it on the
        event loop (an ssh round trip that blocks it), so an engine set's engines were signalled
        one after another (Note [Light remote waits])."""
        import asyncio
        from signal import SIGKILL, SIGTERM

        loop = asyncio.get_running_loop()
        for sig, wait in ((SIGTERM, self.stop_seconds_until_kill), (SIGKILL, self.stop_timeout)):
            try:
                await loop.run_in_executor(None, self.signal, sig)
            except Exception as error:
                self.log.debug("Signal %s to engine %s failed: %r", sig, self.pid, error)
            try:
                await self.join(timeout=wait)
            except TimeoutError:
                if sig == SIGKILL:
                    raise
                self.log.warning("Engine %s on %s did not exit %s s after SIGTERM", self.pid,
                                 self.location, wait)  # fmt: skip
            else:
                return

    def get_output(self, remove: bool = False) -> str:
        """The engine's output, read from its host once (`read_code`), and removed there with
        `remove`; "" when the host cannot be reached (logged)."""
        if self._output is None:
            try:
                self._output = self.ssh_sender.check_output_python_code(
                    read_code(self.remote_output_file, remove), stderr=subprocess.PIPE
                )
            except (OSError, subprocess.CalledProcessError) as error:
                self.log.warning("Could not read the output of engine %s on %s: %s", self.pid,
                                 self.location, error)  # fmt: skip
                self._output = ""
        return str(self._output)

    def wait_one(self, timeout: float | None) -> int:
        """Wait up to `timeout` s for the engine on its host to exit (as ipyparallel's, with a
        remote Python that imports nothing heavy: `wait_code`); its exit code (-1: unknown).

        Raises:
            TimeoutError: it is still running.
        """
        out = self.ssh_sender.check_output_python_code(wait_code(self.pid, timeout))
        if "__process_running=1__" in out:
            raise TimeoutError("still running")
        if "__process_running=0__" not in out:
            raise RuntimeError(out)
        return -1

    def signal(self, sig: int) -> None:
        """Send `sig` to the engine on its host; nothing to do if it has exited.

        Raises:
            HostUnreachableError: the host could not be reached or refused the signal (its
                stderr is in the message and logged as a warning).
        """
        if self.state != "running":
            return
        try:
            self.ssh_sender.check_output_python_code(
                kill_code(self.pid, sig), stderr=subprocess.PIPE
            )
        except subprocess.CalledProcessError as error:
            said = (error.stderr or "").strip() or f"exit status {error.returncode}"
            self.log.warning("Signal %s to engine %s on %s failed: %s", sig, self.pid,
                             self.location, said)  # fmt: skip
            raise HostUnreachableError(
                f"Signal {sig} to the engine (pid {self.pid}) on {self.location} failed: {said}. "
                "If the host is unreachable, its engines stop with it; else stop pid "
                f"{self.pid} there by hand."
            ) from None


class ConcurrentSSHEngineSetLauncher(SSHEngineSetLauncher):  # type: ignore[misc]
    """ipyparallel's ssh engine set, its engines started at the same time, and a quiet stop."""

    launcher_class = SSHStopEngineLauncher

    def start(self, n: int) -> list[str]:
        """Start up to `n` engines on the hosts of `engines` (as ipyparallel's), all at once."""
        engine_traits = self.launcher_class.class_traits(config=True)
        shared = set(self.traits(config=True)).intersection(engine_traits)
        inherited = shared.difference({"location", "user", "hostname", "to_send", "to_fetch"})
        inherited = inherited.union({"profile_dir", "cluster_id"})
        self.loop  # noqa: B018  (the engines' wait threads report to this thread's loop)
        per_host: list[tuple[list[Any], dict[str, Any]]] = []
        started = 0
        for full_host, n_or_config in self.engines.items():
            if isinstance(n_or_config, dict):
                overrides = dict(n_or_config)
                count = overrides.pop("n", 1)
            else:
                overrides, count = {}, n_or_config
            user, _, host = full_host.rpartition("@")
            host, _, port = host.partition(":")
            where = {"user": user or None, "hostname": host, "port": port or None}
            launchers = []
            files_sent = threading.Event()
            for i in range(min(count, n - started)):
                # lists copied: a launcher given a port appends `-p PORT` to its ssh_args
                kwargs = {attr: _copied(getattr(self, attr)) for attr in inherited}
                kwargs.update(overrides)
                kwargs["parent"] = self
                kwargs["identifier"] = key = f"{full_host}/{i}"
                launcher = self.launchers[key] = self.launcher_class(**kwargs)
                launcher.loop  # noqa: B018  (read here, on the loop's thread)
                launcher.files_sent = files_sent
                if i > 0:
                    launcher.to_send = []  # the first engine of the host sends the files
                launcher.on_stop(self._notice_engine_stopped)
                launchers.append((key, launcher))
                started += 1
            if launchers:
                per_host.append((launchers, where))
        began = time.monotonic()
        every = [(launcher, where) for launchers, where in per_host for _, launcher in launchers]
        with ThreadPoolExecutor(max_workers=max(1, len(every))) as pool:
            futures = [pool.submit(launcher.start, **where) for launcher, where in every]
            for future in futures:
                future.result()  # the first failure is raised, as ipyparallel's would be
        self.log.debug("ssh engines started in %.1f s", time.monotonic() - began)
        keys = [key for launchers, _ in per_host for key, _ in launchers]
        self.notify_start(keys)
        self.n = started
        return keys


# Note [Light remote waits]: ipyparallel waits for an ssh engine by running, on its host, a Python
# that imports ipyparallel to call psutil's wait: a background wait per engine (every 60 s) and
# one more per stop, each importing ipyparallel, zmq and traitlets there. On 2 cores with 4
# engines a `%dist stop` spent 8-15 s in those imports and in fetching each engine's output (three
# ssh round trips each, one engine after another). `wait_code` asks the same question with `os`
# and `/proc` only, and `read_code` reads and removes the output at once. And ipyparallel's
# engine-set stop gathers its engines' stop coroutines, but each sends SIGTERM with a blocking ssh
# command before its first await, so the engines were signalled one after another (0.4-0.8 s each
# here); `stop` sends the signals from threads, so every engine is signalled and waited for at
# once.


def _copied(value: Any) -> Any:
    """A list or dict trait's value copied (each engine launcher gets its own)."""
    return type(value)(value) if isinstance(value, (list, dict)) else value
