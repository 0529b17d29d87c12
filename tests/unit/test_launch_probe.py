"""`probe_hosts`, the ssh check before engines start on other hosts: a host ssh cannot reach
is named with what ssh said and the fix, as a `HostUnreachableError` (a `ConnectionError`).
Uses the real `ssh` client on a name that never resolves (`.invalid`, RFC 2606)."""

from __future__ import annotations

import shutil
import sys

import pytest

from nbdist.cluster.errors import HostUnreachableError
from nbdist.cluster.launch.launchers import ipyparallel_settings, probe_hosts
from nbdist.cluster.launch.plan import make_plan


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the ssh client")
def test_an_unreachable_host_is_named_with_the_fix():
    plan = make_plan(hosts="no-such-host.invalid:2", launcher="ssh", backend="gloo")
    settings = ipyparallel_settings(plan, heartbeat_ms=1000)
    with pytest.raises(HostUnreachableError, match=r"no-such-host\.invalid") as failed:
        probe_hosts(settings, ["no-such-host.invalid"], sys.executable, timeout=20)
    assert isinstance(failed.value, ConnectionError)
    assert "without a password prompt" in str(failed.value)
