"""A real Jupyter kernel on a namespace host, driven from a test on this machine's network.

The kernel must run on the notebook's host (`nb`, its own network stack), but a test's Jupyter
client cannot reach a kernel listening on a namespace's loopback. So a small driver runs on the
host next to the kernel (`python -m nbdist.testing.host_kernel`): it starts the kernel with
jupyter_client (the interpreter that runs the tests, this checkout's nbdist first on the
path), then reads cells as JSON lines on its stdin and answers each with what the cell printed,
its result and its error, as one JSON line on its stdout. `HostKernel` is the test's end.

Example (as root)::

    with host_cluster(2) as hosts, HostKernel(hosts) as kernel:
        reply = kernel.execute("import socket; socket.gethostname()")
        assert reply["result"] == "'nb'"
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["HostKernel", "KernelCellError"]

_START_S = 180.0


class KernelCellError(AssertionError):
    """A cell raised (or ran past its timeout) in the host's kernel; the message shows it."""


class HostKernel:
    """A kernel on `host` of a `HostCluster` (default: the notebook's host), with its driver.

    `execute(code)` runs a cell and returns `{"stdout", "stderr", "result", "error",
    "seconds"}`; `send(code)` and `receive()` do the same in two steps (to act while a cell
    runs). `kernel_pid` is the kernel's pid (on the host). `close()` shuts it down.
    """

    def __init__(self, hosts: Any, host: str = "nb", env: dict[str, str] | None = None) -> None:
        self._process = hosts.popen(
            host,
            [sys.executable, "-m", "nbdist.testing.host_kernel", json.dumps(env or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            ready = self._next(_START_S)
        except BaseException:
            self.close()
            raise
        self.kernel_pid: int = int(ready["kernel_pid"])
        self.driver_pid: int = self._process.pid

    def __enter__(self) -> HostKernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, code: str, timeout: float = 180.0) -> None:
        """Start running `code` as a cell (the kernel interrupts it after `timeout`)."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"code": code, "timeout": timeout}) + "\n")
        self._process.stdin.flush()

    def receive(self, timeout: float = 200.0) -> dict[str, Any]:
        """The reply to the oldest cell sent and not yet received."""
        return self._next(timeout)

    def execute(self, code: str, timeout: float = 180.0, *, allow_error: bool = False) -> dict:
        """Run `code` as a cell and return its reply.

        Raises:
            KernelCellError: the cell raised (unless `allow_error`) or timed out.
        """
        self.send(code, timeout)
        reply = self.receive(timeout + 30)
        if reply["error"] and not allow_error:
            raise KernelCellError(f"cell failed:\n{code}\n--- output:\n{_show(reply)}")
        return reply

    def close(self, timeout: float = 60.0) -> None:
        """Shut the kernel down (its driver ends on the closed stdin), killing it if slow."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=timeout)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise KernelCellError(
                f"no answer from the host's kernel within {timeout:g} s"
            ) from None
        if line is None:
            raise KernelCellError(
                "the host's kernel driver exited:\n" + "".join(self._stderr[-40:])
            )
        return json.loads(line)

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("{"):
                self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self._stderr.append(line)


def _show(reply: dict[str, Any]) -> str:
    parts = [reply.get("stdout", ""), reply.get("stderr", "")]
    if reply.get("error"):
        parts.append("\n".join(reply["error"].get("traceback", [])) or str(reply["error"]))
    return "\n".join(part for part in parts if part)


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _run_cell(client: Any, code: str, timeout: float, alive: Any = None) -> dict[str, Any]:
    begin = time.monotonic()
    msg_id = client.execute(code)
    reply: dict[str, Any] = {"stdout": "", "stderr": "", "result": None, "error": None}
    deadline = begin + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            reply["error"] = {"ename": "CellTimeout", "evalue": f"ran past {timeout:g} s"}
            break
        try:
            message = client.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            if alive is not None and not alive():
                reply["error"] = {"ename": "DeadKernel", "evalue": "the kernel died"}
                break
            continue
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            reply[content["name"]] += content["text"]
        elif kind in ("execute_result", "display_data"):
            text = content.get("data", {}).get("text/plain")
            if kind == "execute_result":
                reply["result"] = text
            elif text:
                reply["stdout"] += text + "\n"
        elif kind == "error":
            reply["error"] = {
                "ename": content["ename"],
                "evalue": content["evalue"],
                "traceback": [_strip_ansi(line) for line in content["traceback"]],
            }
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply["seconds"] = time.monotonic() - begin
    return reply


def main() -> None:
    """The driver: start a kernel, run each JSON line of stdin as a cell, answer on stdout."""
    import os
    import tempfile

    from nbdist.testing.kernels import _kernel_env, _kernel_manager

    extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    out = sys.stdout
    sys.stdout = sys.stderr  # jupyter_client's own prints must not mix with the replies
    with _kernel_manager() as km, tempfile.TemporaryDirectory(prefix="nbdist-ipython-") as ipy:
        km.start_kernel(env=_kernel_env(extra, ipy), cwd=os.getcwd())
        try:
            client = km.client()
            client.start_channels()
            client.wait_for_ready(timeout=_START_S)
            pid = km.provisioner.process.pid
            out.write(json.dumps({"kernel_pid": pid}) + "\n")
            out.flush()
            for line in sys.stdin:
                if not line.strip():
                    continue
                request = json.loads(line)
                if not km.is_alive():
                    dead = {"ename": "DeadKernel", "evalue": "the kernel died"}
                    reply = {"stdout": "", "stderr": "", "result": None, "error": dead}
                else:
                    reply = _run_cell(
                        client, request["code"], float(request.get("timeout", 180)), km.is_alive
                    )
                if reply["error"] and reply["error"]["ename"] == "CellTimeout" and km.is_alive():
                    km.interrupt_kernel()
                out.write(json.dumps(reply) + "\n")
                out.flush()
            client.stop_channels()
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=False)


if __name__ == "__main__":
    main()
