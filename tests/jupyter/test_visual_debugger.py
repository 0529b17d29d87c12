"""JupyterLab's visual debugger on replicas (issue 31, item 3) in a real kernel, driven as
JupyterLab drives it: Debug Adapter Protocol requests (`debug_request`) on jupyter_client's
control channel, `debug_event`s on IOPub. A breakpoint set in a `%%distribute` cell's file
(`dumpCell` + `setBreakpoints`) stops both replicas; each is a thread `replica N`; its frames
are in the cell's file, its variables are its own; `next` steps the chosen replica; `continue`
lets every replica go on and the cell ends with the same result as without the breakpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import time

import pytest

from tests.jupyter.conftest import EXTENSION, start_kernel_manager
from tests.jupyter.test_kernel import CELL_TIMEOUT_S, Kernel

pytestmark = pytest.mark.cluster

THREAD_BASE = 1 << 20
CELL = (
    "%%distribute\n"
    "rank = strategy.cluster_resolver.task_id\n"
    "x = 10 * (rank + 1)\n"
    "y = x + 1\n"
    "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(y))), axis=None)\n"
    "(x, y, float(total))\n"
)
WAIT_S = 60.0


class Dap:
    """A DAP client over a kernel's control channel, as JupyterLab's debugger service is."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.client = kernel.client
        self._seq = itertools.count(1)
        self.events: list[dict] = []
        self.output: list[str] = []  # the cell's output seen while waiting for events

    def request(self, command: str, timeout: float = WAIT_S, **arguments) -> dict:
        seq = next(self._seq)
        content = {"type": "request", "seq": seq, "command": command, "arguments": arguments}
        msg = self.client.session.msg("debug_request", content)
        self.client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no debug_reply to {command} within {timeout} s"
            with contextlib.suppress(queue.Empty):
                reply = self.client.control_channel.get_msg(timeout=left)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    return reply["content"]

    def event(self, name: str, timeout: float = WAIT_S, **body) -> dict:
        """The next `debug_event` `name` whose body has `body`'s items (others are kept)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                wanted = all(event.get("body", {}).get(k) == v for k, v in body.items())
                if event["event"] == name and wanted:
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            assert left > 0, f"no {name} event {body} within {timeout} s; got {self.events}"
            with contextlib.suppress(queue.Empty):
                msg = self.client.get_iopub_msg(timeout=min(left, 0.5))
                if msg["msg_type"] == "debug_event":
                    self.events.append(msg["content"])
                elif msg["msg_type"] == "stream":
                    self.output.append(msg["content"]["text"])
                elif msg["msg_type"] == "execute_result":
                    self.output.append(msg["content"]["data"]["text/plain"])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    km = start_kernel_manager(tmp_path_factory.mktemp("jupyter"))
    k = None
    try:
        k = Kernel(km)
        _, error = k.run(f"%load_ext {EXTENSION}\n%dist start -n 2")
        assert error is None, error
        yield k
    finally:
        if k is not None and km.is_alive():
            with contextlib.suppress(Exception):
                k.run("%dist stop", timeout=60)
        if k is not None:
            with contextlib.suppress(Exception):
                k.client.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def dap(kernel):
    """One debugger session for the module, as JupyterLab keeps one while it is switched on
    (ipykernel 7.4's debugger answers no second `initialize` after a `disconnect`, with or
    without nbdist): the last test disconnects."""
    session = Dap(kernel)
    assert session.request(
        "initialize", clientID="test", adapterID="python", pathFormat="path",
        linesStartAt1=True, columnsStartAt1=True,
    )["success"]  # fmt: skip
    assert session.request("attach")["success"]
    assert session.request("configurationDone")["success"]
    return session


def _variables(dap: Dap, frame_id: int) -> dict[str, str]:
    scopes = dap.request("scopes", frameId=frame_id)
    assert scopes["success"], scopes
    found = {}
    for scope in scopes["body"]["scopes"]:
        reply = dap.request("variables", variablesReference=scope["variablesReference"])
        assert reply["success"], reply
        found.update({v["name"]: v["value"] for v in reply["body"]["variables"]})
    return found


def test_a_breakpoint_in_a_distribute_cell_stops_both_replicas_in_the_visual_debugger(kernel, dap):
    path = dap.request("dumpCell", code=CELL)["body"]["sourcePath"]
    reply = dap.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": 4}])
    assert reply["success"], reply
    msg_id = kernel.send(CELL)
    try:
        for rank in (0, 1):
            stopped = dap.event("stopped", threadId=THREAD_BASE + rank)
            assert stopped["body"]["reason"] == "breakpoint"

        threads = dap.request("threads")["body"]["threads"]
        names = {t["id"]: t["name"] for t in threads}
        assert names[THREAD_BASE] == "replica 0" and names[THREAD_BASE + 1] == "replica 1"
        info = dap.request("debugInfo")["body"]
        assert {THREAD_BASE, THREAD_BASE + 1} <= set(info["stoppedThreads"])

        # replica 1's frames first, in the cell's file at the breakpoint's line; then replica 0's
        frames = dap.request("stackTrace", threadId=THREAD_BASE + 1)["body"]["stackFrames"]
        assert frames[0]["name"] == "replica 1: <module>", frames
        assert frames[0]["source"]["path"] == path and frames[0]["line"] == 4
        other = [f for f in frames if f["name"].startswith("replica 0")]
        assert other and other[0]["line"] == 4
        assert _variables(dap, frames[0]["id"])["x"] == "20"
        assert "y" not in _variables(dap, frames[0]["id"])  # stopped before line 4 ran
        assert _variables(dap, other[0]["id"])["x"] == "10"
        evaluated = dap.request("evaluate", expression="x * 2", frameId=frames[0]["id"])
        assert evaluated["body"]["result"] == "40", evaluated

        # the Variables panel last showed replica 0's frame: `next` steps replica 0 ...
        assert dap.request("next", threadId=THREAD_BASE + 1)["success"]
        assert dap.event("stopped", threadId=THREAD_BASE)["body"]["reason"] == "step"
        frames = dap.request("stackTrace", threadId=THREAD_BASE)["body"]["stackFrames"]
        assert frames[0]["line"] == 5 and _variables(dap, frames[0]["id"])["y"] == "11"
        # ... and replica 1 stays where it was
        mine = [f for f in frames if f["name"].startswith("replica 1")]
        assert mine[0]["line"] == 4

        # continue: every replica goes on, and the cell ends as without the breakpoint
        reply = dap.request("continue", threadId=THREAD_BASE)
        assert reply["success"] and reply["body"]["allThreadsContinued"], reply
        for rank in (0, 1):  # each replica's session ends with the cell
            dap.event("thread", threadId=THREAD_BASE + rank, reason="exited")
        text, error = kernel.collect(msg_id, timeout=CELL_TIMEOUT_S)
        assert error is None, error
        assert "PerReplica:{0: (10, 11, 32.0), 1: (20, 21, 32.0)}" in "".join(dap.output) + text
    finally:  # the breakpoint removed (a click in the gutter again)
        assert dap.request("setBreakpoints", source={"path": path}, breakpoints=[])["success"]
    # without the breakpoint, the same cell runs through
    text, error = kernel.run(CELL)
    assert error is None and "PerReplica:{0: (10, 11, 32.0)" in text, (text, error)


def test_interrupting_the_cell_while_replicas_are_stopped(kernel, dap):
    """The stop button while both replicas are stopped in the visual debugger interrupts the
    cell as anywhere else (ClusterInterrupted), and the cluster runs the next cell."""
    path = dap.request("dumpCell", code=CELL)["body"]["sourcePath"]
    assert dap.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3}])[
        "success"
    ]
    msg_id = kernel.send(CELL)
    try:
        for rank in (0, 1):
            dap.event("stopped", threadId=THREAD_BASE + rank)
        kernel.km.interrupt_kernel()
        text, error = kernel.collect(msg_id, timeout=CELL_TIMEOUT_S)
        assert error is not None and error["ename"] == "ClusterInterrupted", (text, error)
    finally:
        assert dap.request("setBreakpoints", source={"path": path}, breakpoints=[])["success"]
    text, error = kernel.run(CELL)
    assert error is None and "PerReplica:{0: (10, 11, 32.0)" in text, (text, error)


LOOP = "%%distribute\nsteps = 0\nfor i in range(3):\n    steps += 1\nsteps * 100 + rank"


def test_switching_the_debugger_off_lets_stopped_replicas_go_on(kernel, dap):
    """A breakpoint in a loop stops each replica again at each pass; `pause` of a replica is
    refused with the reason; `disconnect` (the bug button off) forgets the breakpoints on the
    engines and the cell finishes."""
    path = dap.request("dumpCell", code=LOOP)["body"]["sourcePath"]
    assert dap.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": 4}])[
        "success"
    ]
    msg_id = kernel.send(LOOP)
    try:
        dap.event("stopped", threadId=THREAD_BASE + 1)
        dap.event("stopped", threadId=THREAD_BASE)
        # continue only replica 1: it stops at the next pass, replica 0 stays
        reply = dap.request("continue", threadId=THREAD_BASE + 1, singleThread=True)
        assert reply["success"] and not reply["body"]["allThreadsContinued"], reply
        dap.event("stopped", threadId=THREAD_BASE + 1)
        frames = dap.request("stackTrace", threadId=THREAD_BASE + 1)["body"]["stackFrames"]
        assert _variables(dap, frames[0]["id"])["i"] == "1"
        zero = next(f for f in frames if f["name"].startswith("replica 0"))
        assert _variables(dap, zero["id"])["i"] == "0"

        refused = dap.request("pause", threadId=THREAD_BASE + 1)
        assert not refused["success"] and "%dist stack" in refused["message"], refused
    finally:
        assert dap.request("disconnect", restart=False, terminateDebuggee=True)["success"]
    text, error = kernel.collect(msg_id, timeout=CELL_TIMEOUT_S)
    assert error is None, error
    assert "PerReplica:{0: 300, 1: 301}" in "".join(dap.output) + text, (dap.output, text)
