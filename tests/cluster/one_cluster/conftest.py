"""One `nd.Cluster` of 2 real CPU engines for every test file of this package.

The files here are the topics of what one running cluster does (runs and values, remote errors,
turns and timeouts); they share one cluster (package-scoped `cluster`), started once, and
under pytest-xdist run on one worker (`_ONE_WORKER_PER_PACKAGE` in tests/conftest.py). A test
may use what one before it in its file left on the engines, never what another file left.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbdist.cluster import Cluster
from tests.cluster.conftest import cluster_starter
from tests.cluster.replica_functions import TIMEOUT


@pytest.fixture(scope="package")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with cluster_starter(request, tmp_path_factory) as start:
        cluster = start()
        cluster.strategy.timeout = TIMEOUT
        yield cluster
