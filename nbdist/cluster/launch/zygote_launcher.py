"""ipyparallel's local engine launchers, with engines forked from a `Zygote` instead of `Popen`.

`ZygoteEngineSetLauncher` is ipyparallel's `LocalEngineSetLauncher` whose engines are
`ZygoteEngineLauncher`s: the same command line, environment, working directory and log file,
given to the zygote (`zygote.Zygote.fork`) instead of a new process. Everything else is
ipyparallel's: the launcher knows the engine by its pid (`psutil.Process`), stops it with
SIGTERM then SIGKILL after `stop_seconds_until_kill`, waits for it in a thread (which is how
an engine that exits before registering is noticed: `startup.wait_for_registration`), and
reads its output from its log file. The engine is the zygote's child, not the notebook's: the
zygote collects its exit status, and the launcher's thread sees the pid go (psutil polls a pid
that is not its child), so its exit code reads as unknown (None). An `engine_cmd` other than
nbdist's engine (given in `launcher_options`) is started as a process of its own, as
ipyparallel would.

Settings: `ZygoteEngineLauncher.zygote_socket`, the socket of a `Zygote` started in this
process (`launchers.ipyparallel_settings` names this class; `Cluster.start` sets the socket).
Imports ipyparallel: import it only when starting engines.

Example (as `Cluster.start` does it; starts processes)::

    config.ZygoteEngineLauncher.zygote_socket = zygote.socket_path
    ipyparallel.Cluster(engine_launcher_class=ZygoteEngineSetLauncher, config=config, ...)
"""

from __future__ import annotations

import os
from typing import Any

import psutil
from ipyparallel.cluster.launcher import (
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    ProcessStateError,
)
from traitlets import Unicode

from nbdist.cluster.launch.zygote import ENGINE_MODULE, running_zygote

__all__ = ["ZygoteEngineLauncher", "ZygoteEngineSetLauncher"]


class ZygoteEngineLauncher(LocalEngineLauncher):  # type: ignore[misc]
    """One local engine, forked by the zygote listening on `zygote_socket`."""

    zygote_socket = Unicode("", config=True, help="The socket of the zygote that forks engines.")

    def start(self) -> Any:
        """Ask the zygote for the engine; then as ipyparallel's `LocalProcessLauncher.start`."""
        if ENGINE_MODULE not in self.args:  # launcher_options' own engine_cmd: run it as given
            return super().start()
        if self.state != "before":
            raise ProcessStateError(f"The process was already started and has state: {self.state}")
        zygote = running_zygote(self.zygote_socket)
        env = os.environ.copy()
        env.update(self.get_env())
        self.pid = zygote.fork(self.args, env, self.work_dir, self.output_file)
        self.process = psutil.Process(self.pid)
        self.notify_start(self.pid)
        self._start_waiting()
        return None


class ZygoteEngineSetLauncher(LocalEngineSetLauncher):  # type: ignore[misc]
    """ipyparallel's local engine set, each engine forked by the zygote (`ZygoteEngineLauncher`)."""

    launcher_class = ZygoteEngineLauncher
