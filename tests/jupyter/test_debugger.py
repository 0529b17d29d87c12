"""The debugger on replicas (issue 31) in a real kernel, driven through jupyter_client's
shell, IOPub and stdin channels as a front end does: `breakpoint()` in a `%%distribute` cell
opens `(Pdb replica N) ` through the kernel's stdin; commands go to that replica's pdb;
`replica N` switches; the collective timeout pauses while a replica is at the prompt; Ctrl-C
at the prompt interrupts the cell; `%dist debug` opens the same prompt in the frames of the
last failure; Tab completes names that exist only on the engines.

One kernel with `%dist start -n 2 --collective-timeout 3` serves the module.
"""

from __future__ import annotations

import contextlib
import queue
import time

import psutil
import pytest

from tests.jupyter.conftest import EXTENSION, start_kernel_manager
from tests.jupyter.test_kernel import CELL_TIMEOUT_S, Kernel

pytestmark = pytest.mark.cluster

COLLECTIVE_TIMEOUT_S = 3


class Session:
    """One cell run with answers typed at its input prompts: `prompts` (as shown), `text` (its
    output), `error` (its error content, or None)."""

    def __init__(self, kernel: Kernel, cell: str, answers, timeout: float = CELL_TIMEOUT_S):
        self.prompts: list[str] = []
        self.text = ""
        self.error = None
        self.status = None
        client = kernel.client
        msg_id = client.execute(cell, allow_stdin=True)
        deadline = time.monotonic() + timeout
        idle = False
        while not idle:
            assert time.monotonic() < deadline, f"cell not done in {timeout} s: {self.text!r}"
            with contextlib.suppress(queue.Empty):
                request = client.get_stdin_msg(timeout=0.05)
                if request["msg_type"] == "input_request":
                    prompt = request["content"]["prompt"]
                    self.prompts.append(prompt)
                    self.text += prompt
                    answer = answers(self, prompt)
                    if answer is not None:
                        self.text += answer + "\n"
                        client.input(answer)
            with contextlib.suppress(queue.Empty):
                while True:
                    msg = client.get_iopub_msg(timeout=0.05)
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        self.text += content["text"]
                    elif kind == "error":
                        self.error = content
                    elif kind in ("execute_result", "display_data"):
                        self.text += content["data"].get("text/plain", "") + "\n"
                    elif kind == "status" and content["execution_state"] == "idle":
                        idle = True
                        break
        self.status = kernel.reply(msg_id)["content"]["status"]


def scripted(*lines: str):
    """Answers `lines` in order, one per prompt; then `c`."""
    pending = list(lines)

    def answer(session: Session, prompt: str) -> str:
        return pending.pop(0) if pending else "c"

    return answer


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    km = start_kernel_manager(tmp_path_factory.mktemp("jupyter"))
    pids: list[int] = []
    k = None
    try:
        k = Kernel(km)
        text, error = k.run(
            f"%load_ext {EXTENSION}\n%dist start -n 2 --collective-timeout {COLLECTIVE_TIMEOUT_S}"
        )
        assert error is None, error
        text, error = k.run(
            "from nbdist.magics import current_cluster\nprint('PIDS', *current_cluster().processes)"
        )
        pids = [int(p) for p in text.split("PIDS", 1)[1].split()]
        k.pids = pids
        yield k
    finally:
        if k is not None and km.is_alive():
            with contextlib.suppress(Exception):
                k.run("%dist stop", timeout=60)
        if k is not None:
            with contextlib.suppress(Exception):
                k.client.stop_channels()
        km.shutdown_kernel(now=True)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


ONE_STOPS = (
    "%%distribute\n"
    "rank = strategy.cluster_resolver.task_id\n"
    "x = 10 * (rank + 1)\n"
    "if rank == 1:\n"
    "    breakpoint()\n"
    "y = x + 1\n"
    "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(y))), axis=None)\n"
    "(x, y, float(total))\n"
)


def test_breakpoint_on_replica_1_prints_its_values_and_the_cell_ends_as_without_it(kernel):
    session = Session(kernel, ONE_STOPS, scripted("p x", "n", "p y", "c"))
    assert session.error is None, (session.error, session.text)
    assert session.prompts[0] == "(Pdb replica 1) ", session.prompts
    print(session.text)
    assert 0
