"""An in-process parameter-server cluster with more than one worker (`nd.Server` threads:
2 ps tasks and 2 workers in one process, as docs/parameter-server.md shows with one), and the
exit status of a script that runs a ps task (issue 23, item 8).

Each case is a script in a subprocess with a timeout: a crash of the heap (two workers that
shared one process-wide state corrupted it once) or an exit hook must not take pytest down.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow]

_CLUSTER = """
import sys
import torch
import nbdist as nd
from nbdist.testing.ports import free_ports

ports = free_ports(4)
spec = nd.ClusterSpec({
    "worker": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
    "ps": [f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"],
})
servers = [nd.Server(spec, "ps", 0), nd.Server(spec, "ps", 1),
           nd.Server(spec, "worker", 0), nd.Server(spec, "worker", 1)]
strategy = nd.ParameterServerStrategy(spec)
with strategy.scope():
    model = torch.nn.Linear(4, 1)
    steps = nd.Variable(0, name="steps")
coordinator = nd.experimental.coordinator.ClusterCoordinator(strategy)
torch.manual_seed(0)
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)

def train(x, y):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    steps.assign_add(1)
    return loss.detach()
"""


def _run(body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = _CLUSTER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout
    )


def test_two_worker_servers_in_one_process_count_every_function_once():
    # Before: the workers shared one process-wide set of variable copies, so 21 functions
    # gave 22-39 step updates, autograd errors ("modified by an inplace operation") or a
    # heap corruption abort.
    done = _run(
        """
        for _ in range(3):
            results = [coordinator.schedule(train, args=(x, y)) for _ in range(21)]
            coordinator.join()
            losses = [r.fetch() for r in results]
        print("steps", int(steps.read_value()))
        print("workers", sorted({r.worker for r in results}))
        print("loss", float(losses[0]) > float(losses[-1]))
        coordinator.shutdown(); strategy.close()
        for server in servers:
            server.stop()
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "steps 63" in lines, done.stdout
    assert "loss True" in lines, done.stdout


def test_a_script_with_a_ps_task_that_raises_exits_non_zero():
    # Before: the ps task's exit hook called os._exit(0) while sessions were open, so an
    # uncaught exception (and sys.exit(3)) ended the script with status 0.
    done = _run(
        """
        coordinator.schedule(train, args=(x, y))
        coordinator.join()
        raise RuntimeError("the script failed")
        """
    )
    assert "RuntimeError: the script failed" in done.stderr
    assert done.returncode == 1, done.stderr[-3000:]
    exited = _run(
        """
        coordinator.schedule(train, args=(x, y))
        coordinator.join()
        sys.exit(3)
        """
    )
    assert exited.returncode == 3, exited.stderr[-3000:]


_PS_WITH_REMOTE_CLIENT = """
import subprocess, sys, time
import torch
from nbdist.strategies.parameter_server.ps_task import PSTask

task = PSTask("127.0.0.1", 0).start()
# A client in another process keeps its session open (its thread waits in a gloo receive)
# and leaves when this process has gone.
client = subprocess.Popen([sys.executable, "-c", f'''
import os, time, torch
from nbdist.strategies.parameter_server.transport import PSClient
parent = os.getppid()
client = PSClient(0, "127.0.0.1:{task.port}", 60)  # kept: its session stays open
client.create({{1: torch.zeros(3)}})
print("connected", flush=True)
deadline = time.monotonic() + 60
while os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
'''], stdout=subprocess.PIPE, text=True)
assert client.stdout.readline().strip() == "connected"
deadline = time.monotonic() + 30
while not task._live and time.monotonic() < deadline:
    time.sleep(0.01)
assert task._live, "the client's session never started"
END
"""


@pytest.mark.parametrize(
    "end, status",
    [("pass", 0), ("sys.exit(3)", 3), ("raise RuntimeError('the script failed')", 1)],
)
def test_a_ps_task_with_another_process_connected_keeps_the_scripts_status(end, status):
    # The case the old os._exit(0) hook was written for: Python finalises while a session
    # thread of a client in another process waits in gloo; the status is the script's own.
    script = _PS_WITH_REMOTE_CLIENT.replace("END", end)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == status, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
