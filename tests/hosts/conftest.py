"""Fixtures for tests on namespace hosts (`nbdist.testing.hosts`).

`hosts` is a module-scoped `HostCluster` of the notebook's host `nb` and two engine hosts `h1`,
`h2`, each with its own network stack, 198.18.0.x address, hostname and sshd; it is removed at
the module's end (every process in each namespace stopped by pid). Outside CI a machine that
cannot make them (not root, no `ip netns`, no sshd) skips these tests with the reason; under CI
(`CI` set, as root, with `.ci/run`'s packages) they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from nbdist.testing.hosts import HostCluster, skip_reason


def require_hosts() -> None:
    """Skip (fail under CI) where namespace hosts cannot be made."""
    reason = skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"namespace hosts are required in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def hosts() -> Iterator[HostCluster]:
    """nb, h1 and h2: up for the module, removed at its end."""
    require_hosts()
    cluster = HostCluster(2).up()
    try:
        yield cluster
    finally:
        cluster.close()
