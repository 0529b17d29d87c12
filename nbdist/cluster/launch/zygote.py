"""`Zygote`: the notebook's handle on an engine zygote (`_zygote_main`), a fork server.

Local engines forked from one process that has already imported torch, ipyparallel's engine
and nbdist's engine side start without importing them again: a start's CPU then grows by a
fork and a registration per engine, not by ~2 s of imports. `Cluster.start` starts a zygote
first, so its imports overlap the controller's start-up, and the local launcher
(`zygote_launcher.ZygoteEngineSetLauncher`) asks it for each engine with the command line,
environment, directory and log file it would have given a new process.

Used where `zygote_wanted()` says so: the local launcher on Linux (`os.fork`), unless
`NBDIST_ZYGOTE=0` in the notebook's environment, which starts every engine as a Python of its
own as before. ssh, mpi and slurm engines never use it (they run on other machines, or under
mpiexec/srun).

Lifetime: the zygote reads its stdin, a pipe from this process; `stop()` closes it, and so does
the OS when this process dies, however it dies: the zygote then terminates the engines it
forked and exits (it also watches its parent's pid). Imports no torch and no ipyparallel.

Example (starts a process, so not run here)::

    zygote = Zygote.start(timeout=120)
    pid = zygote.fork(args, env, cwd, output_file)     # an engine's pid
    zygote.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from nbdist.cluster.errors import ClusterStartError, EngineTimeoutError
from nbdist.cluster.launch.parent_watch import parent_flag

__all__ = [
    "ENGINE_MODULE",
    "ZYGOTE_ENV",
    "ZYGOTE_MODULE",
    "ControllerSpare",
    "Zygote",
    "discard_spare",
    "keep_warm",
    "keeps_warm",
    "return_spare",
    "running_zygote",
    "spare_controller",
    "start_spare",
    "start_spare_controller",
    "take_spare",
    "take_spare_controller",
    "warm_zygote",
    "zygote_wanted",
]

ZYGOTE_MODULE = "nbdist.cluster.launch._zygote_main"
ENGINE_MODULE = "nbdist.cluster.launch._engine_main"
"""The module every engine runs; the zygote runs it in each engine it forks."""
ZYGOTE_ENV = "NBDIST_ZYGOTE"
"""`NBDIST_ZYGOTE=0` turns the zygote off: every local engine is a Python of its own."""

_CONNECT_POLL_S = 0.02
_RUNNING: dict[str, Zygote] = {}  # socket path -> the zygote this process started


def running_zygote(socket_path: str) -> Zygote:
    """The zygote this process started that listens on `socket_path` (for the launcher, which
    ipyparallel configures with strings only).

    Raises:
        ClusterStartError: no such zygote runs (stopped, or never started here).
    """
    zygote = _RUNNING.get(socket_path)
    if zygote is None:
        raise ClusterStartError(
            f"No engine zygote of this process listens on {socket_path!r} (it was stopped). "
            "Start the cluster again with Cluster.start(), or set NBDIST_ZYGOTE=0."
        )
    return zygote


def zygote_wanted(launcher: str) -> bool:
    """Whether engines of `launcher` are forked from a zygote here: `local`, on Linux, unless
    `NBDIST_ZYGOTE` is `0`, `false`, `no` or `off`.

    Example:
        >>> zygote_wanted("ssh")
        False
    """
    setting = os.environ.get(ZYGOTE_ENV, "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return launcher == "local" and sys.platform.startswith("linux") and hasattr(os, "fork")


class Zygote:
    """A running zygote process: `fork` asks it for an engine, `stop` ends it.

    Attributes:
        process: Its `subprocess.Popen`.
        socket_path: The Unix socket it answers on (in a directory only its owner can enter).
    """

    what = "engine zygote"
    """What the process is called in errors."""
    fix = (
        f"Set {ZYGOTE_ENV}=0 in the notebook's environment to start every engine as a Python "
        "process of its own."
    )
    """What an error about it suggests."""

    def __init__(self, process: subprocess.Popen[bytes], directory: str, timeout: float):
        self.process = process
        self.directory = directory
        self.socket_path = os.path.join(directory, "socket")
        self.log_path = os.path.join(directory, "zygote.log")
        self.timeout = timeout
        self.limit = timeout
        """The start's whole timeout, named when `fork` runs out of `timeout`."""
        self._lock = threading.Lock()

    @classmethod
    def start(cls, timeout: float, env: Mapping[str, str] | None = None) -> Zygote:
        """Launch a zygote (it begins its imports at once); return without waiting for them.

        Args:
            timeout: Seconds a `fork` waits for the zygote to be ready.
            env: Variables added to this process's environment for the zygote: those read
                when torch is imported (`OMP_NUM_THREADS`) must be the engines' already.
        """
        directory = tempfile.mkdtemp(prefix=f"nbdist-{cls.__name__.lower()}-")  # mode 0700
        environment = dict(os.environ)
        environment.update(env or {})
        environment["PYTHONUNBUFFERED"] = "1"
        with open(os.path.join(directory, "zygote.log"), "ab") as log:
            process = subprocess.Popen(
                cls._command(os.path.join(directory, "socket")),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # a Ctrl-C in the notebook is not the zygote's
            )  # fmt: skip
        zygote = cls(process, directory, timeout)
        _RUNNING[zygote.socket_path] = zygote
        return zygote

    @classmethod
    def _command(cls, socket_path: str) -> list[str]:
        return [sys.executable, "-m", ZYGOTE_MODULE, socket_path, parent_flag()]

    @property
    def pid(self) -> int:
        """The zygote's pid."""
        return self.process.pid

    def output(self) -> str:
        """What the zygote printed (its imports' errors)."""
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()
        except OSError:
            return ""

    def fork(self, args: Sequence[str], env: Mapping[str, str], cwd: str, output: str) -> int:
        """Fork an engine that runs as `args` would, with environment `env` (all of it), in
        `cwd`, printing to `output`; its pid. Waits for the zygote's imports, up to `timeout`.

        Raises:
            ClusterStartError: the zygote exited or refused; the message has its output.
            EngineTimeoutError: it was not ready within `timeout` (still importing).
        """
        request = {"args": list(args), "env": dict(env), "cwd": cwd, "output": output}
        with self._lock:  # one request at a time (launchers start engines one by one)
            deadline = time.monotonic() + self.timeout
            connection = self._connect(deadline)
            with connection:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    connection.sendall(json.dumps(request).encode() + b"\n")
                    line = connection.makefile("rb").readline()
                except TimeoutError:
                    raise self._late("was still importing") from None
                except OSError as error:
                    raise self._error(f"did not answer ({error})") from None
        if not line:
            raise self._error("exited before forking the engine")
        reply = json.loads(line)
        if "error" in reply:
            raise self._error(f"could not fork the engine: {reply['error']}")
        return int(reply["pid"])

    def _connect(self, deadline: float) -> socket.socket:
        while True:
            if self.process.poll() is not None:
                raise self._error(f"exited with status {self.process.returncode}")
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self.socket_path)
                return connection
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()  # not listening yet: it has just started
            if time.monotonic() >= deadline:
                raise self._late("was not listening yet")
            time.sleep(_CONNECT_POLL_S)

    def _late(self, what: str) -> EngineTimeoutError:
        return EngineTimeoutError(
            f"The engines did not start within timeout={self.limit:g} s: the {self.what} "
            f"(pid {self.pid}) {what}. Raise the timeout (Cluster(timeout=...), or `%dist "
            "start --timeout S`) on a slow or busy machine."
        )

    def _error(self, what: str) -> ClusterStartError:
        text = self.output().strip()
        tail = "\n".join(text.splitlines()[-30:])
        return ClusterStartError(
            f"The {self.what} (pid {self.pid}) {what}. {self.fix}"
            + (f"\n--- its output:\n{tail}" if tail else "")
        )

    def stop(self, grace: float = 5.0) -> None:
        """Close its stdin (it terminates the engines it forked that still run, then exits),
        wait up to `grace` s, kill it if it is still there, remove its directory."""
        _RUNNING.pop(self.socket_path, None)
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        shutil.rmtree(self.directory, ignore_errors=True)


class ControllerSpare(Zygote):
    """A controller process that imported ipyparallel's controller and waits to become the
    next cluster's controller (`_controller_main` with `SPARE_FLAG`): `fork` hands it the
    launcher's command line once (`controller_launcher.SpareControllerLauncher`) and returns
    its own pid. Kept only while this process keeps a cluster warm (`keep_warm`)."""

    what = "spare controller"
    fix = "Turn the warm start off (`%dist warm off`) to start each controller afresh."

    @classmethod
    def _command(cls, socket_path: str) -> list[str]:
        from nbdist.cluster.launch._controller_main import CONTROLLER_MODULE, SPARE_FLAG

        return [sys.executable, "-m", CONTROLLER_MODULE, f"{SPARE_FLAG}{socket_path}",
                parent_flag()]  # fmt: skip

    def forget(self) -> None:
        """Stop tracking it without stopping it: it became a cluster's controller, which the
        cluster's launcher stops (its socket and directory are removed now)."""
        _RUNNING.pop(self.socket_path, None)
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()  # its stdin is /dev/null now: no end of file seen
        shutil.rmtree(self.directory, ignore_errors=True)


_SPARE_CONTROLLER: list[ControllerSpare] = []  # at most one, only while kept warm


def take_spare_controller() -> ControllerSpare | None:
    """The waiting spare controller (no longer spare), or None when there is none alive."""
    while _SPARE_CONTROLLER:
        spare = _SPARE_CONTROLLER.pop()
        if spare.process.poll() is None:
            return spare
        spare.stop()
    return None


def spare_controller() -> ControllerSpare | None:
    """The spare controller waiting for the next start, if any (alive)."""
    if _SPARE_CONTROLLER and _SPARE_CONTROLLER[0].process.poll() is None:
        return _SPARE_CONTROLLER[0]
    return None


def start_spare_controller(timeout: float = 120.0) -> None:
    """Start a spare controller for the next local start, when this process keeps a cluster
    warm (`keep_warm(True)`) and none waits (`Cluster.stop` calls it, so a restart takes it)."""
    if not _WARM[0] or not zygote_wanted("local"):
        return
    if _SPARE_CONTROLLER and _SPARE_CONTROLLER[0].process.poll() is None:
        return
    _discard_spare_controller()
    _SPARE_CONTROLLER.append(ControllerSpare.start(timeout))
    _register_atexit()


def _discard_spare_controller() -> None:
    while _SPARE_CONTROLLER:
        _SPARE_CONTROLLER.pop().stop()


_SPARE: list[Zygote] = []  # at most one: started ahead of a start that will take it
_WARM: list[bool] = [False]  # keep_warm(True): a spare is kept ready between clusters


def start_spare(launcher: str = "local", timeout: float = 120.0) -> None:
    """Start a zygote now for the next `Cluster.start` of this process to take (`take_spare`),
    when `launcher`'s engines would use one and none is waiting: `%dist start` calls it before
    its own imports (torch, ipyparallel), so that the zygote imports alongside them.

    A spare stops with this process (its stdin closes), at exit, or by `discard_spare()`.
    """
    if not zygote_wanted(launcher):
        return
    if _SPARE and _SPARE[0].process.poll() is None:
        return
    while _SPARE:
        _SPARE.pop().stop()
    _SPARE.append(Zygote.start(timeout))
    _register_atexit()


def take_spare() -> Zygote | None:
    """The waiting spare zygote (no longer spare), or None when there is none alive."""
    while _SPARE:
        zygote = _SPARE.pop()
        if zygote.process.poll() is None:
            return zygote
        zygote.stop()
    return None


def discard_spare(unless_warm: bool = False) -> None:
    """Stop the spare zygote and spare controller, if any (a `%dist start` that failed before
    starting); with `unless_warm`, only when they are not kept warm (`keep_warm`)."""
    if unless_warm and _WARM[0]:
        return
    while _SPARE:
        _SPARE.pop().stop()
    _discard_spare_controller()


def return_spare(zygote: Zygote) -> bool:
    """Keep `zygote` (whose engines have all been stopped) as the warm spare when this process
    keeps one (`keep_warm(True)`) and has none yet; True if it was kept (else stop it)."""
    if not _WARM[0] or zygote.process.poll() is not None:
        return False
    if _SPARE and _SPARE[0].process.poll() is None:
        return False
    while _SPARE:
        _SPARE.pop().stop()
    _SPARE.append(zygote)
    return True


def keep_warm(on: bool, timeout: float = 120.0) -> Zygote | None:
    """Keep an engine zygote ready between clusters (`on`), or not (the default).

    On: a zygote is started now (unless one waits already) and imports torch, ipyparallel's
    engine and nbdist's engine side, and a spare controller imports ipyparallel's controller;
    the next local `Cluster.start` forks its engines from the zygote and makes the spare its
    controller without waiting for those imports; `stop()` hands the zygote back instead of
    stopping it and starts the next spare controller. They hold their memory meanwhile
    (docs/notebooks.md says how much). Off: the waiting zygote is
    stopped now; a cluster's own zygote stops with it again. Either way it stops when this
    process exits or dies. `%dist warm on|off` calls this.

    Returns:
        The waiting zygote (on), or None.
    """
    _WARM[0] = bool(on)
    if not on:
        discard_spare()
        return None
    start_spare("local", timeout)
    start_spare_controller(timeout)
    return warm_zygote()


def warm_zygote() -> Zygote | None:
    """The zygote waiting for the next start, if any (alive)."""
    if _SPARE and _SPARE[0].process.poll() is None:
        return _SPARE[0]
    return None


def keeps_warm() -> bool:
    """Whether this process keeps a zygote ready between clusters (`keep_warm`)."""
    return _WARM[0]


_atexit_registered: list[bool] = []


def _register_atexit() -> None:
    if not _atexit_registered:
        import atexit

        atexit.register(discard_spare)
        _atexit_registered.append(True)
