"""Faults around the engines on namespace hosts: a lost ssh session, a killed kernel.

- ipyparallel starts each engine over ssh in the background (the session that started it ends
  at once) and keeps one ssh session per engine only to watch it. Killing those sessions and
  the host's sshd (so nothing can log in there any more) leaves the engines running and
  usable, and still nothing is left on any host after `%dist stop`: the engines are stopped
  through the controller, and stop by themselves once it is gone (Note [Engines without a
  parent] in `nbdist.cluster.launch.controller_watch`).
- Killing the notebook's kernel (SIGKILL: none of its exit handlers runs) stops the
  controller (it watches the kernel) and then every engine on every host within 10 s.

Each test starts its own kernel on `nb` and one engine on each of h1 and h2.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbdist.testing.host_kernel import HostKernel
from nbdist.testing.hosts import HostCluster

from .test_engines_across_hosts import START_S, start_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]  # a start over ssh: up to 240 s

GONE_WITHIN_S = 10.0
"""The issue's bound for engines on every host after the kernel is killed."""
SLACK_S = 3.0
"""What a loaded 2-core machine may add (the processes' own exit, polling)."""


@pytest.fixture
def started(hosts: HostCluster, tmp_path: Path) -> Iterator[HostKernel]:
    with HostKernel(hosts, env={"IPYTHONDIR": str(tmp_path / "ipython")}) as kernel:
        kernel.execute("%load_ext nbdist")
        line = start_line(hosts, tmp_path).replace("h1:2,h2:2", "h1:1,h2:1")
        kernel.execute(line, timeout=START_S + 60)
        try:
            yield kernel
        finally:
            kernel.execute("%dist stop", timeout=120, allow_error=True)


def engines_on(hosts: HostCluster, name: str) -> list[str]:
    return [p for p in hosts.processes(name) if "_engine_main" in p]


def wait_until_empty(hosts: HostCluster, names: list[str], limit: float) -> float:
    """Seconds until no process but the kernel's driver is left on `names` (fails at `limit`)."""
    began = time.monotonic()
    while True:
        left = {n: [p for p in hosts.processes(n) if "host_kernel" not in p] for n in names}
        if not any(left.values()):
            return time.monotonic() - began
        assert time.monotonic() - began < limit, f"still running after {limit} s: {left}"
        time.sleep(0.1)  # polling the hosts' processes (bounded by the limit)


def test_a_lost_ssh_session_orphans_nothing(hosts: HostCluster, started: HostKernel):
    sessions = [
        p for p in hosts.processes("nb") if p.split(": ", 1)[1].startswith("ssh ") and " h2 " in p
    ]
    assert sessions, hosts.processes("nb")  # ipyparallel watches the engine over ssh
    for line in sessions:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    hosts.stop_sshd("h2")
    try:
        reply = started.execute(
            "%%distribute\nimport torch.distributed as dist\n"
            "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
        )
        assert reply["stdout"].count("sum 2.0") == 2, reply["stdout"]
        assert len(engines_on(hosts, "h2")) == 1
        began = time.monotonic()
        started.execute("%dist stop", timeout=120)
        wait_until_empty(hosts, ["h1", "h2"], GONE_WITHIN_S + SLACK_S)
        print(f"\nnothing left on h1, h2 {time.monotonic() - began:.1f} s after %dist stop")
    finally:
        hosts.start_sshd("h2")


def test_a_killed_kernel_leaves_no_engine_on_any_host(hosts: HostCluster, started: HostKernel):
    assert engines_on(hosts, "h1") and engines_on(hosts, "h2")
    os.kill(started.kernel_pid, signal.SIGKILL)
    took = wait_until_empty(hosts, ["nb", "h1", "h2"], GONE_WITHIN_S + SLACK_S)
    print(f"\nevery process on nb, h1, h2 gone {took:.1f} s after the kernel was killed")
    assert took < GONE_WITHIN_S + SLACK_S
