"""Run a notebook, or a list of cells, in a real Jupyter kernel (nbclient) and get it back.

Tests of notebooks, of ```ipython doc examples and of the magics need a real kernel: a fresh
process running ipykernel, not an in-process shell. `run_notebook` and `run_cells` start one
with the interpreter that runs the tests (`sys.executable`, through a private kernelspec, so a
`python` found on PATH never answers), give it this checkout's `nbdist` first on `PYTHONPATH`,
run every cell with a per-cell timeout, and always shut the kernel down. A failing or
timed-out cell raises `NotebookFailed`, whose message names the cell and shows its source and
everything it printed. Importing this module starts nothing.

Example:
    >>> from nbdist.testing.kernels import cell_text, run_cells
    >>> nb = run_cells(["x = 6 * 7", "print(x)"], timeout=60)  # doctest: +SKIP
    >>> cell_text(nb.cells[1])  # doctest: +SKIP
    '42\\n'
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "CELL_TIMEOUT_S",
    "PIDS_CELL",
    "KernelClient",
    "NotebookFailed",
    "cell_text",
    "close_cluster_kernel",
    "cluster_kernel",
    "find_cell",
    "pids_printed",
    "run_cells",
    "run_notebook",
    "stream_warts",
]

CELL_TIMEOUT_S = 180
"""Default seconds one cell may run before the kernel is interrupted and the run fails."""

_KERNEL_NAME = "nbdist-test-python"
_STARTUP_TIMEOUT_S = 120
_SOURCE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])  # the folder holding nbdist/


class NotebookFailed(AssertionError):
    """A cell raised or ran past its timeout; the message shows that cell and its output."""

    def __init__(self, message: str, notebook: Any, index: int | None) -> None:
        super().__init__(message)
        self.notebook = notebook
        self.index = index


def cell_text(cell: Any) -> str:
    """All a code cell printed or showed as text: streams, `text/plain` results, errors.

    Example:
        >>> import nbformat
        >>> cell = nbformat.v4.new_code_cell("1")
        >>> cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\\n")]
        >>> cell_text(cell)
        'hi\\n'
    """
    parts = []
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            parts.append(output.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain")
            if text:
                parts.append(text if text.endswith("\n") else text + "\n")
        elif kind == "error":
            parts.append(f"{output.get('ename')}: {output.get('evalue')}\n")
    return "".join(parts)


_WARNING = re.compile(r"\b[A-Z]\w*Warning\b|\bwarnings\.warn\(")
_HTML_TAG = re.compile(
    r"</?(span|div|table|thead|tbody|tr|td|th|b|i|u|p|br|hr|pre|code|style|script|a|img|ul|ol"
    r"|li|h[1-6]|em|strong|small|sup|sub|svg|button|label|input)(\s[^<>]*)?/?>",
    re.IGNORECASE,
)


def stream_warts(notebook: Any) -> list[str]:
    """Lines of a notebook's stream outputs that a reader should never see: a Python warning
    (`UserWarning: ...`, `warnings.warn(`) or HTML-looking text (`<span ...>`, `</table>`), each
    as `cell N: line`.

    Example:
        >>> import nbformat
        >>> cell = nbformat.v4.new_code_cell("x")
        >>> cell.outputs = [nbformat.v4.new_output("stream", name="stderr",
        ...                 text="ok\\n/x.py:3: UserWarning: careful\\n<b>42</b> items\\n")]
        >>> stream_warts(nbformat.v4.new_notebook(cells=[cell]))
        ['cell 0: /x.py:3: UserWarning: careful', 'cell 0: <b>42</b> items']
    """
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream":
                continue
            for line in output.get("text", "").splitlines():
                if _WARNING.search(line) or _HTML_TAG.search(line):
                    found.append(f"cell {index}: {line.strip()}")
    return found


def find_cell(notebook: Any, marker: str) -> Any:
    """The first code cell whose source contains `marker` (a test's way to name a cell).

    Raises:
        KeyError: No code cell contains it (the notebook changed; update the test).

    Example:
        >>> import nbformat
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("a = 1")])
        >>> find_cell(nb, "a =").source
        'a = 1'
    """
    for cell in notebook.cells:
        if cell.cell_type == "code" and marker in cell.source:
            return cell
    raise KeyError(f"no code cell contains {marker!r}; the notebook changed, update the test")


def run_cells(
    sources: Sequence[str],
    *,
    timeout: float = CELL_TIMEOUT_S,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    allow_errors: bool = False,
) -> Any:
    """Run `sources` as the code cells of a new notebook in a real kernel; return it executed.

    Args:
        sources: Cell sources, run in order in one kernel.
        timeout: Seconds each cell may run.
        cwd: The kernel's working folder (default: the current one).
        env: Extra environment variables for the kernel.
        allow_errors: Keep going after a failing cell instead of raising `NotebookFailed`.

    Example:
        >>> nb = run_cells(["print(1 + 1)"])  # doctest: +SKIP
    """
    import nbformat

    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in sources]
    )
    return _execute(notebook, "<cells>", timeout, cwd, env, allow_errors)


def run_notebook(
    path: str | os.PathLike[str],
    *,
    timeout: float = CELL_TIMEOUT_S,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    allow_errors: bool = False,
) -> Any:
    """Run the notebook at `path` end to end in a real kernel; return it executed (not saved).

    The kernel starts in `cwd`, by default the notebook's own folder (so relative paths in the
    notebook mean what they mean when a user opens it).

    Example:
        >>> nb = run_notebook("notebooks/01-quickstart.ipynb")  # doctest: +SKIP
    """
    import nbformat

    path = pathlib.Path(path)
    notebook = nbformat.read(path, as_version=4)
    folder = cwd if cwd is not None else path.resolve().parent
    return _execute(notebook, str(path), timeout, folder, env, allow_errors)


@contextlib.contextmanager
def _kernel_manager() -> Iterator[Any]:
    """A KernelManager for this interpreter's ipykernel, found through a private kernelspec."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    with tempfile.TemporaryDirectory(prefix="nbdist-kernelspec-") as root:
        spec = pathlib.Path(root) / _KERNEL_NAME
        spec.mkdir()
        kernel = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "nbdist (tests)",
            "language": "python",
        }
        (spec / "kernel.json").write_text(json.dumps(kernel))
        specs = KernelSpecManager(kernel_dirs=[root])
        yield KernelManager(kernel_name=_KERNEL_NAME, kernel_spec_manager=specs)


def _kernel_env(extra: Mapping[str, str] | None, ipython_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [_SOURCE_ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["IPYTHONDIR"] = ipython_dir  # no shared history database between parallel kernels
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    env.pop("MPLBACKEND", None)  # the kernel's inline backend draws figures as outputs
    env.update(extra or {})
    return env


def _execute(notebook, name, timeout, cwd, env, allow_errors):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    folder = str(cwd if cwd is not None else pathlib.Path.cwd())
    with _kernel_manager() as km, tempfile.TemporaryDirectory(prefix="nbdist-ipython-") as ipy:
        client = NotebookClient(
            notebook,
            km=km,
            timeout=timeout,
            startup_timeout=_STARTUP_TIMEOUT_S,
            interrupt_on_timeout=True,
            allow_errors=allow_errors,
            shutdown_kernel="immediate",
            resources={"metadata": {"path": folder}},
        )
        try:
            client.execute(env=_kernel_env(env, ipy))
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
            index = _failing_cell(notebook)
            raise NotebookFailed(_describe(name, notebook, index, error), notebook, index) from None
        finally:
            with contextlib.suppress(Exception):  # execute() shuts it down; make sure
                if km.has_kernel:
                    km.shutdown_kernel(now=True)
    return notebook


def _failing_cell(notebook) -> int | None:
    """The cell with an error output, else the last one that started (a timeout)."""
    last = None
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            return index
        if cell.get("execution_count") is not None or cell.get("outputs"):
            last = index
    return last


def _describe(name: str, notebook, index: int | None, error: BaseException) -> str:
    kind = type(error).__name__
    if index is None:
        return f"{name}: {kind} before any cell ran: {error}"
    cell = notebook.cells[index]
    output = cell_text(cell).strip() or "(no output)"
    return (
        f"{name}: cell {index} failed ({kind}).\n"
        f"--- source ---\n{cell.source}\n--- output ---\n{output[-6000:]}\n--- error ---\n"
        f"{str(error)[-4000:]}"
    )


# -- a kernel driven over its channels (tests of Ctrl-C, restarts, the debugger) --------------
_REPLY_TIMEOUT_S = 120.0

PIDS_CELL = "from nbdist.magics import current_cluster\nprint('PIDS', *current_cluster().processes)"
"""A cell that prints the pids of the kernel's cluster after `PIDS` (read by `pids_printed`)."""


class KernelClient:
    """A started kernel (a `jupyter_client` `KernelManager`'s) and its client, driven as a front
    end does: `run(code)` returns (text, error content), `send` and `collect` and `reply` split
    that up (to interrupt a cell that is running, or read its output as it comes).

    Example (starts a kernel, so not run here)::

        kernel = KernelClient(km)
        text, error = kernel.run("print(6 * 7)")     # ('42\\n', None)
    """

    def __init__(self, km: Any):
        self.km = km
        self.client = km.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=_REPLY_TIMEOUT_S)

    def send(self, code: str) -> str:
        return self.client.execute(code)

    def collect(
        self, msg_id: str, until: Any = None, timeout: float = _REPLY_TIMEOUT_S
    ) -> tuple[str, Any]:
        """Outputs of `msg_id` until idle (or until `until(text)` is true): (text, error)."""
        text, error = "", None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no idle within {timeout} s; got {text!r}"
            try:
                msg = self.client.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text += content["text"]
            elif kind == "error":
                error = content
            elif kind in ("execute_result", "display_data"):
                text += content["data"].get("text/plain", "")
            elif kind == "status" and content["execution_state"] == "idle":
                return text, error
            if until is not None and until(text):
                return text, error

    def reply(self, msg_id: str, timeout: float = _REPLY_TIMEOUT_S) -> dict:
        """The shell reply to `msg_id` (earlier replies are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no reply within {timeout} s"
            msg = self.client.get_shell_msg(timeout=remaining)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def run(self, code: str, timeout: float = _REPLY_TIMEOUT_S) -> tuple[str, Any]:
        msg_id = self.send(code)
        outputs = self.collect(msg_id, timeout=timeout)
        self.reply(msg_id, timeout=timeout)
        return outputs


def pids_printed(text: str) -> list[int]:
    """The pids `PIDS_CELL` printed (in `text`, the cell's output)."""
    return [int(p) for p in text.split("PIDS", 1)[1].split()]


def close_cluster_kernel(km: Any, kernel: Any, pids: Sequence[int]) -> None:
    """Shut down a kernel that may have started a cluster, leaving none of `pids` behind.

    `%dist stop` goes through the kernel's own client (`kernel.run`; skipped when `kernel` is
    None or the kernel died), then its channels close (stopping the channels of another client
    first left `%dist stop` without a reply for 60 s), the kernel is shut down, and every pid in
    `pids` still there is killed, even when a test failed.

    Example (starts a kernel, so not run here)::

        try:
            kernel = KernelClient(km)
            ...
        finally:
            close_cluster_kernel(km, kernel, pids)
    """
    import psutil

    if kernel is not None and km.is_alive():
        with contextlib.suppress(Exception):
            kernel.run("%dist stop", timeout=60)
    if kernel is not None:
        with contextlib.suppress(Exception):
            kernel.client.stop_channels()
    km.shutdown_kernel(now=True)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


@contextlib.contextmanager
def cluster_kernel(
    km: Any,
    start: str,
    kernel_type: Callable[[Any], Any] = KernelClient,
    text_and_error: Callable[[Any], tuple[str, Any]] = lambda result: result,
) -> Iterator[Any]:
    """`kernel_type(km)` after running the cell `start` (which starts a cluster, e.g.
    `%load_ext nbdist` and `%dist start -n 2`; it must not fail), with the cluster's pids in
    `kernel.pids`; closed on exit by `close_cluster_kernel`. `text_and_error` turns what
    `kernel.run` returns into (text, error content).

    Example (starts a kernel, so not run here)::

        with cluster_kernel(km, "%load_ext nbdist\\n%dist start -n 2") as kernel:
            text, error = kernel.run("%dist status")
    """
    pids: list[int] = []
    kernel = None
    try:
        kernel = kernel_type(km)
        text, error = text_and_error(kernel.run(start))
        assert error is None, error
        text, error = text_and_error(kernel.run(PIDS_CELL))
        pids = pids_printed(text)
        kernel.pids = pids
        yield kernel
    finally:
        close_cluster_kernel(km, kernel, pids)
