"""Fixtures for tests that start real ipyparallel engines (`nd.Cluster`).

- Every test leaves no child process behind (autouse `no_leftover_processes`); clusters also
  check, when they stop, that every process they had (controller, schedulers, engines and the
  engines' nannies, which are not our descendants once their engine exits) is gone.
- `start_cluster(**kwargs)` starts one cluster per test module (a module-scoped factory with a
  finalizer that stops it), in a module-private `IPYTHONDIR`, so the modules' tests share it;
  the files of `one_cluster/` share one cluster for the package (`cluster_starter`).
- Starting engines costs seconds, so under pytest-xdist the tests of each module here run on
  one worker (`pytest_xdist_make_scheduler` in tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest

from nbdist.cluster import Cluster
from nbdist.testing import assert_processes_gone, no_leftover_processes

STOP_DEADLINE_S = 15.0


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    with no_leftover_processes(grace=10.0):
        yield


def stop_and_check(cluster: Cluster) -> None:
    """Stop `cluster` and check that none of its processes is left."""
    pids = cluster.processes if cluster.running else ()
    cluster.stop()
    assert_processes_gone(pids, STOP_DEADLINE_S)


@contextlib.contextmanager
def cluster_starter(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Cluster]]:
    """`start(**kwargs)`: a started `Cluster(n=2, ...)`, stopped (and checked) when `request`'s
    scope ends, in a private `IPYTHONDIR` set while the `with` lasts. For a fixture of any
    scope: the module's `start_cluster` here, the package's `cluster` in one_cluster/."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))

        def start(**kwargs) -> Cluster:
            cluster = Cluster(**{"n": 2, "timeout": 90.0, **kwargs})
            request.addfinalizer(lambda: stop_and_check(cluster))
            begin = time.perf_counter()
            cluster.start()
            print(f"\nCluster start to ready: {time.perf_counter() - begin:.2f} s ({cluster!r})")
            return cluster

        yield start


@pytest.fixture(scope="module")
def start_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Cluster]]:
    """`start_cluster(**kwargs)`: a started `Cluster(n=2, ...)`, stopped at the module's end."""
    with cluster_starter(request, tmp_path_factory) as start:
        yield start
