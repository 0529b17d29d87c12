"""Fixtures for the Jupyter front end: an in-process IPython shell with `%load_ext nbdist`.

- `dist_shell`: one IPython shell per test module with nbdist's magics loaded and 2 CPU
  engines started by `%dist start -n 2`; its finalizer runs `%dist stop` and checks that no
  process of the cluster is left. The modules' tests share it (start ≈ 5-8 s).
- Under pytest-xdist the tests of each module here run on one worker
  (`pytest_xdist_make_scheduler` in tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbdist
from nbdist.testing import assert_processes_gone

EXTENSION = "nbdist" if hasattr(nbdist, "load_ipython_extension") else "nbdist._extension"
"""`%load_ext nbdist` once `nbdist` re-exports the hooks of `nbdist._extension`."""

def start_kernel_manager(root: Path):
    """A started ipykernel (this Python) under a kernel spec and IPYTHONDIR inside `root`,
    for the tests that drive a real kernel over its channels; the caller shuts it down."""
    from jupyter_client.manager import KernelManager

    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel_json = {"argv": argv, "display_name": "nbdist test kernel", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel_json))
    env = {**os.environ, "JUPYTER_PATH": str(root), "IPYTHONDIR": str(root / "ipython")}
    km = KernelManager(kernel_name="python3")
    km.kernel_spec_manager.kernel_dirs.insert(0, str(root / "kernels"))
    km.start_kernel(env=env)
    return km


@pytest.fixture
def extension() -> str:
    """The name `%load_ext` takes (`EXTENSION`)."""
    return EXTENSION


@pytest.fixture
def processes_gone():
    """`assert_processes_gone(pids)`, for tests."""
    return assert_processes_gone


@pytest.fixture(scope="module")
def ipython(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The in-process IPython shell with nbdist's magics, in a module-private IPYTHONDIR."""
    from IPython.core.interactiveshell import InteractiveShell

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", EXTENSION)
        yield shell
        shell.run_line_magic("unload_ext", EXTENSION)


@pytest.fixture(scope="module")
def dist_shell(ipython) -> Iterator[object]:
    """`ipython` after `%dist start -n 2`; stopped (and checked) at the module's end."""
    from nbdist.magics import current_cluster

    try:
        ipython.run_line_magic("dist", "start -n 2 --timeout 90")
        yield ipython
    finally:
        cluster = current_cluster()
        pids = cluster.processes if cluster is not None and cluster.running else ()
        ipython.run_line_magic("dist", "stop")
        assert current_cluster() is None
        assert_processes_gone(pids)
