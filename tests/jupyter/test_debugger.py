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

from nbdist.testing.kernels import KernelClient as Kernel
from nbdist.testing.kernels import cluster_kernel
from tests.jupyter.conftest import EXTENSION, start_kernel_manager
from tests.jupyter.test_kernel import CELL_TIMEOUT_S

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
                    idle = self._drain(client, msg_id, 0.3)  # what was printed before it
                    prompt = request["content"]["prompt"]
                    self.prompts.append(prompt)
                    self.text += prompt
                    answer = answers(self, prompt)
                    if answer is not None:
                        self.text += answer + "\n"
                        client.input(answer)
            idle = idle or self._drain(client, msg_id, 0.05)
        self.status = kernel.reply(msg_id)["content"]["status"]

    def _drain(self, client, msg_id: str, wait: float) -> bool:
        """Take the cell's IOPub messages until none comes for `wait` s; True once idle."""
        with contextlib.suppress(queue.Empty):
            while True:
                msg = client.get_iopub_msg(timeout=wait)
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
                    return True
        return False


def scripted(*lines: str):
    """Answers `lines` in order, one per prompt; then `c`."""
    pending = list(lines)

    def answer(session: Session, prompt: str) -> str:
        return pending.pop(0) if pending else "c"

    return answer


def _pids_by_rank(kernel: Kernel) -> dict[int, int]:
    text, error = kernel.run(
        "from nbdist.magics import current_cluster\n"
        "print('RANKS', *[f'{e.rank}:{e.pid}' for e in current_cluster().engines])"
    )
    assert error is None, error
    pairs = [item.split(":") for item in text.split("RANKS", 1)[1].split()]
    return {int(rank): int(pid) for rank, pid in pairs}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    km = start_kernel_manager(tmp_path_factory.mktemp("jupyter"))
    start = f"%load_ext {EXTENSION}\n%dist start -n 2 --collective-timeout {COLLECTIVE_TIMEOUT_S}"
    with cluster_kernel(km, start) as k:
        k.pids_by_rank = _pids_by_rank(k)
        yield k


def test_dist_debug_with_no_failure_names_the_fix(kernel):
    text, error = kernel.run("%dist debug")  # IPython shows a UsageError as one line
    assert "UsageError: %dist debug: no failure to debug" in text, (text, error)
    assert "Run the failing cell first, then `%dist debug`" in text, text
    text, error = kernel.run("%dist debug 0")  # the engine itself has no failure either
    assert "UsageError: %dist debug: Replica 0 has no failure to debug" in text, (text, error)


ONE_STOPS = (
    "%%distribute\n"
    "import time\n"
    "rank = strategy.cluster_resolver.task_id\n"
    "x = 10 * (rank + 1)\n"
    "if rank == 1:\n"
    "    breakpoint()\n"
    "y = x + 1\n"
    "began = time.monotonic()\n"
    "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(y))), axis=None)\n"
    "waited = time.monotonic() - began\n"
    "(x, y, float(total))\n"
)
HOLD_S = COLLECTIVE_TIMEOUT_S + 3


def test_breakpoint_on_replica_1_held_past_the_collective_timeout_ends_as_without_it(kernel):
    without = Session(kernel, ONE_STOPS.replace("breakpoint()", "pass"), scripted())
    assert without.error is None and not without.prompts, without.text
    assert "PerReplica:{0: (10, 11, 32.0), 1: (20, 21, 32.0)}" in without.text, without.text

    held = {}

    def answer(session: Session, prompt: str) -> str:
        if "status" not in held:
            held["status"] = True
            return "%dist status"
        if "c" not in held and session.text.count("(Pdb replica 1) ") >= 5:
            # at the prompt for longer than the collective timeout while replica 0 waits
            time.sleep(HOLD_S)
            held["c"] = True
        return next(commands)

    commands = iter(["p x", "n", "p y", "c"])
    session = Session(kernel, ONE_STOPS, answer)
    assert session.error is None, (session.error, session.text)
    assert set(session.prompts) == {"(Pdb replica 1) "}, session.prompts
    text = session.text
    assert "(Pdb replica 1) p x\n20\n" in text, text  # replica 1's x, not replica 0's 10
    assert "(Pdb replica 1) n\n> Cell In[" in text and "-> y = x + 1" in text, text
    assert "(Pdb replica 1) p y\n21\n" in text, text
    assert "Replica 1 is stopped in the debugger" in text, text
    assert "Replica 0 is waiting for replica 1 in the debugger." in text, text
    assert "PerReplica:{0: (10, 11, 32.0), 1: (20, 21, 32.0)}" in text, text  # as without
    # replica 0 waited in its all-reduce for replica 1, longer than the collective timeout
    waited, error = kernel.run("%%distribute\nround(waited, 1)")
    assert error is None, error
    first = float(waited.split("{0: ", 1)[1].split(",", 1)[0])
    assert first >= HOLD_S, waited


BOTH_STOP = (
    "%%distribute\n"
    "rank = strategy.cluster_resolver.task_id\n"
    "mine = 100 + rank\n"
    "breakpoint()\n"
    "total = strategy.reduce('sum', strategy.run(lambda: torch.tensor(float(mine))), axis=None)\n"
    "float(total)\n"
)


def test_both_replicas_stop_switch_between_them_and_continue_both(kernel):
    steps = []

    def answer(session: Session, prompt: str) -> str:
        if "stopped: 0, 1" not in prompt and not steps:
            return "p mine"  # the other replica has not stopped yet: ask again
        steps.append(prompt)
        return {1: "p mine", 2: "replica 1", 3: "p mine", 4: "c"}.get(len(steps), "c")

    session = Session(kernel, BOTH_STOP, answer)
    assert session.error is None, (session.error, session.text)
    assert steps[0] == "(Pdb replica 0; stopped: 0, 1) ", steps
    assert steps[2] == "(Pdb replica 1; stopped: 0, 1) ", steps
    assert steps[4] == "(Pdb replica 0) ", steps  # replica 1 continued: replica 0 is left
    assert "(Pdb replica 1; stopped: 0, 1) p mine\n101\n" in session.text, session.text
    assert "PerReplica:{0: 201.0, 1: 201.0}" in session.text, session.text


def test_ctrl_c_at_the_prompt_leaves_the_debugger_and_interrupts_the_cell(kernel):
    began = {}

    def answer(session: Session, prompt: str) -> None:
        began["t"] = time.monotonic()
        kernel.km.interrupt_kernel()
        return None

    session = Session(kernel, ONE_STOPS, answer)
    assert time.monotonic() - began["t"] < 5
    assert session.error is not None and session.error["ename"] == "ClusterInterrupted", (
        session.error, session.text)  # fmt: skip
    assert "usable" in session.error["evalue"] and "unusable" not in session.error["evalue"]
    text, error = kernel.run(RIGHT_SUM)
    assert error is None, error
    assert "[0] sum 30.0" in text and "[1] sum 30.0" in text


RIGHT_SUM = (
    "%%distribute\n"
    "import torch.distributed as dist\n"
    "t = torch.tensor([10.0 * (dist.get_rank() + 1)])\n"
    "dist.all_reduce(t)\n"
    "print('sum', t.item())\n"
)
FAILS_ON_1 = (
    "%%distribute\n"
    "def scale(a, b):\n"
    "    q = a * 2\n"
    "    return q / b\n"
    "rank = strategy.cluster_resolver.task_id\n"
    "scale(rank + 1, 1 - rank)\n"
)


def test_dist_debug_after_a_zero_division_on_replica_1_shows_the_failing_frames_locals(kernel):
    text, error = kernel.run(FAILS_ON_1)
    assert error is not None and "ZeroDivisionError" in str(error), error
    session = Session(kernel, "%dist debug", scripted("p a, b, q", "w", "u", "p rank", "c"))
    assert session.error is None, (session.error, session.text)
    assert session.prompts[0] == "(Pdb replica 1) ", session.prompts
    text = session.text
    assert "ZeroDivisionError: division by zero" in text, text
    assert "(Pdb replica 1) p a, b, q\n(2, 0, 4)\n" in text, text
    assert "-> return q / b" in text, text
    assert "(Pdb replica 1) p rank\n1\n" in text, text  # `u`: the cell's frame
    assert "nbdist" not in text.split("(Pdb replica 1) w", 1)[1].split("(Pdb", 1)[0], text


def test_nd_breakpoint_stops_only_the_replica_named_also_in_strategy_run(kernel):
    cell = (
        "import nbdist as nd\n"
        "from nbdist.magics import current_cluster\n"
        "def step():\n"
        "    here = 7 * (nd.get_replica_context().replica_id_in_sync_group + 1)\n"
        "    nd.breakpoint(replica=1)\n"
        "    return here\n"
        "current_cluster().strategy.run(step)\n"
    )
    session = Session(kernel, cell, scripted("p here", "c"))
    print(session.text)
    assert session.error is None, (session.error, session.text)
    assert session.prompts == ["(Pdb replica 1) ", "(Pdb replica 1) "], session.prompts
    assert "(Pdb replica 1) p here\n14\n" in session.text, session.text
    assert "PerReplica:{0: 7, 1: 14}" in session.text, session.text


NO_PROMPT = """
from nbdist.magics import current_cluster
from nbdist.cluster import _wire
from nbdist.cluster.engine_side import entry_points
view = current_cluster().client[current_cluster().engines[1].id]
def accept_within(seconds):
    import nbdist.cluster.engine_side.debugger as debugger
    debugger.ACCEPT_S = seconds
def stops():
    breakpoint()
    return 42
view.apply_sync(accept_within, 1.0)
try:  # ipyparallel directly: no notebook debugger watches this request
    result = view.apply_async(entry_points.call, _wire.encode(_wire.Call.of(stops, (), {})))
    reply = result.get(timeout=60)
finally:
    view.apply_sync(accept_within, 30.0)
print("REPLY", reply["ok"], _wire.loads(reply["value"]))
print("STDERR", result.stderr)
"""


def test_a_breakpoint_no_notebook_attaches_to_says_so_and_goes_on(kernel):
    text, error = kernel.run(NO_PROMPT)
    assert error is None, (text, error)
    assert "REPLY True 42" in text, text
    assert "[nbdist] breakpoint() on replica 1: no notebook debugger attached within 1 s" in text
    assert "the code goes on." in text, text


def _shell_reply(kernel: Kernel, msg_id: str) -> dict:
    return kernel.reply(msg_id, timeout=30)["content"]


ENGINE_ONLY = (
    "%%distribute\n"
    "engine_only_weights = torch.ones(3)\n"
    "def engine_only_fn(a, b=2):\n"
    "    'Adds on the engine.'\n"
    "    return a + b\n"
)


def test_tab_and_shift_tab_answer_from_replica_0s_namespace_within_the_timeout(kernel):
    _text, error = kernel.run(ENGINE_ONLY)
    assert error is None, error
    client = kernel.client
    cell = "%%distribute\nx = engine_only_w"
    matches = _shell_reply(kernel, client.complete(cell, len(cell)))["matches"]
    assert "engine_only_weights" in matches, matches
    plain = "x = engine_only_w"  # not a %%distribute cell: the notebook's own names only
    assert (
        "engine_only_weights"
        not in _shell_reply(kernel, client.complete(plain, len(plain)))["matches"]
    )
    cell = "%%distribute\nengine_only_weights.resh"
    matches = _shell_reply(kernel, client.complete(cell, len(cell)))["matches"]
    assert "engine_only_weights.reshape" in matches, matches
    cell = "%%distribute\nengine_only_fn(1)"
    found = _shell_reply(kernel, client.inspect(cell, len("%%distribute\nengine_only_f")))
    assert found["found"], found
    shown = found["data"]["text/plain"]
    assert "Signature:      engine_only_fn(a, b=2)" in shown and "Adds on the engine." in shown
    assert "from replica 0's namespace" in shown, shown
    # an engine that does not answer (stopped) adds nothing, within the timeout
    engine = psutil.Process(kernel.pids_by_rank[0])
    engine.suspend()
    try:
        cell = "%%distribute\nx = engine_only_w"
        began = time.monotonic()
        matches = _shell_reply(kernel, client.complete(cell, len(cell)))["matches"]
        took = time.monotonic() - began
    finally:
        engine.resume()
    assert "engine_only_weights" not in matches and took < 3, (matches, took)


def test_a_replica_that_dies_at_the_prompt_is_named_and_the_cell_ends(kernel):
    pid = {}

    def answer(session: Session, prompt: str) -> str:
        if not pid:
            pid["killed"] = kernel.pids_by_rank[1]
            psutil.Process(pid["killed"]).kill()
            psutil.Process(pid["killed"]).wait(timeout=20)
        return "p x"

    session = Session(kernel, ONE_STOPS, answer)
    assert "Replica 1 left the debugger" in session.text, session.text
    assert session.error is not None, session.text
    assert "died" in session.error["evalue"] and "replica" in session.error["evalue"].lower()
    _text, error = kernel.run("%dist restart")
    assert error is None, error
    kernel.pids_by_rank = _pids_by_rank(kernel)
    _text, error = kernel.run(RIGHT_SUM)
    assert error is None, error
