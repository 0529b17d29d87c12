"""ipyparallel's local controller launcher, handing its command line to a spare controller.

`SpareControllerLauncher` is ipyparallel's `LocalControllerLauncher` whose `start` gives the
command line, environment, working directory and log file to the spare controller listening on
`spare_socket` (`zygote.ControllerSpare`, a process that already imported ipyparallel's
controller) instead of starting a new Python. Everything else is ipyparallel's: the launcher
knows the controller by its pid (`psutil.Process`), waits for it in a thread and stops it with
SIGTERM. `Cluster.start` uses it when this notebook keeps a cluster warm (`%dist warm on`) and a
spare waits. Imports ipyparallel: import it only when starting a cluster.

Example (as `Cluster.start` does it; starts processes)::

    config.SpareControllerLauncher.spare_socket = spare.socket_path
    ipyparallel.Cluster(controller_launcher_class=SpareControllerLauncher, config=config, ...)
"""

from __future__ import annotations

import os
from typing import Any

import psutil
from ipyparallel.cluster.launcher import LocalControllerLauncher, ProcessStateError
from traitlets import Unicode

from nbdist.cluster.launch.zygote import ControllerSpare, running_zygote

__all__ = ["SpareControllerLauncher"]


class SpareControllerLauncher(LocalControllerLauncher):  # type: ignore[misc]
    """The cluster's controller: the spare controller listening on `spare_socket`."""

    spare_socket = Unicode("", config=True, help="The socket of the spare controller to use.")

    def start(self) -> Any:
        """Hand the command line to the spare; then as ipyparallel's `LocalProcessLauncher`."""
        if self.state != "before":
            raise ProcessStateError(f"The process was already started and has state: {self.state}")
        spare = running_zygote(self.spare_socket)
        env = os.environ.copy()
        env.update(self.get_env())
        self.pid = spare.fork(self.args, env, self.work_dir, self.output_file)
        if isinstance(spare, ControllerSpare):
            spare.forget()  # the cluster's controller now: this launcher stops it
        self._spare = spare  # its Popen, which started the process, lives as long as this
        self.process = psutil.Process(self.pid)
        self.notify_start(self.pid)
        self._start_waiting()
        return None
