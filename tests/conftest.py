"""Test-wide setup: one intra-op thread per process, and Ctrl-C reaching what tests start.

`pytest -n 2` runs two worker processes, and the multi-replica strategies run a thread per
replica inside each; letting torch also start a thread per core would oversubscribe a small
CI machine many times over.

A shell that starts a command in the background (`bash .ci/run &`, nohup, some CI runners)
starts it with SIGINT ignored, and every process started from it inherits that: Python then
installs no KeyboardInterrupt handler, and the tests that press Ctrl-C on a demo, a launcher
or a kernel would wait in vain. Restoring the default here (in every xdist worker, which
imports this file) gives the processes the tests start a working Ctrl-C again.

Under `pytest -n 2`, the tests of one module in the folders that start processes once per
module (engines, kernels, gloo workers: `_ONE_WORKER_PER_MODULE`) run on one xdist worker,
in order: the module's fixture starts them once, and a test may build on the one before it.
This file is the one conftest the xdist controller always loads (a subfolder's conftest only
when that folder is named on the command line), so the scheduler hook lives here.
"""

import os
import signal

import pytest
import torch

_ONE_WORKER_PER_MODULE = (
    "tests/cluster/", "tests/jupyter/", "tests/ps/", "tests/dist/", "tests/hosts/"
)
_ONE_WORKER_PER_PACKAGE = ("tests/cluster/one_cluster/",)
"""Packages whose files share one package-scoped fixture (one cluster): kept on one worker."""


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Keep each module of `_ONE_WORKER_PER_MODULE`, and each package of
    `_ONE_WORKER_PER_PACKAGE` whole, on one xdist worker; other tests spread one by one, as
    xdist's default `load` does."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            normalized = path.replace(os.sep, "/")
            for package in _ONE_WORKER_PER_PACKAGE:
                if package in normalized:
                    return package
            return path if any(part in normalized for part in _ONE_WORKER_PER_MODULE) else nodeid

    return ModulesTogether(config, log)


torch.set_num_threads(1)

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
