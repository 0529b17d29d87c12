"""The engine's half of `%%distribute`: `run_cell` runs one notebook cell on this engine.

It executes the cell's Python code in the engine's interactive namespace (so names persist
between cells, and `strategy`, `nd`, `torch` are there) and evaluates a final expression,
IPython-style. It never raises: it replies with a dict as `calls` does (`{"ok": True,
"value": pickled}` or a failure reply). Each reply carries the fingerprint of the engine's
mirrored parameters (Note [Replica check] in `nbdist.strategies._replica_check`), which the
notebook compares (`magics._cell.check_replicas`). Figures drawn with matplotlib are displayed
as PNG images, as the `inline` backend does, and the notebook shows them.

Example (what the notebook does, through the supervisor)::

    supervise(cluster, engines, cell.run_cell, source, filename, call=Call("a cell"), ...)
"""

from __future__ import annotations

import ast
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from nbdist.cluster import _wire
from nbdist.cluster.engine_side.progress import reset_bars

__all__ = ["run_cell", "show_figures"]


def run_cell(code: str, filename: str, lines: Sequence[int] = ()) -> dict[str, Any]:
    """Execute `code` in the engine's namespace; reply with the last expression's value.
    `lines`: JupyterLab's breakpoints in the cell (`engine_side.dap.line_breaks`)."""
    import linecache

    from nbdist.cluster.engine_side.dap import line_breaks
    from nbdist.cluster.engine_side.guards import noting_the_group, watched_call

    start = time.perf_counter()
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            from nbdist.errors import ContextError

            raise ContextError(
                "%%distribute cells run on ipyparallel engines (IPython kernels), and this "
                "process is not one; start them with nd.Cluster(...).start() or %dist start."
            )
        namespace = shell.user_ns
        _mark_cell_start(filename)
        reset_bars()
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _silenced(code):
            last = ast.Expression(tree.body.pop().value)
        with watched_call(), line_breaks(filename, lines):
            exec(compile(tree, filename, "exec"), namespace)
            value = eval(compile(last, filename, "eval"), namespace) if last else None  # noqa: S307
        show_figures()
        check = _replica_fingerprint()
    except BaseException as error:  # reported to the notebook, never raised here
        with contextlib.suppress(Exception):
            show_figures()  # what was drawn before the error, as a notebook shows it
        from nbdist.cluster.engine_side.failures import failure_reply

        return failure_reply(error, "cell")
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    try:
        data = _wire.dumps(_wire.portable(value))
    except Exception as error:
        reply = _wire.failure(error, "sending the result back")
        reply.update(
            ename="SerializationError",
            evalue=(
                f"The cell ran, but its last expression (a {type(value).__name__}) cannot be "
                f"sent back: {type(error).__name__}: {error}. End the cell with tensors, "
                "numbers or containers of them, or with a `;` to send nothing back."
            ),
            traceback="",
        )
        return reply
    reply = {"ok": True, "value": data, "elapsed": time.perf_counter() - start}
    if check is not None:
        reply["fingerprint"] = check
    return noting_the_group(reply)


def _replica_fingerprint() -> tuple[list[str], list[int], list[list[float]]] | None:
    """This engine's mirrored parameters: names, sizes and fingerprint (None: none)."""
    from nbdist.cluster.engine_side.state import current_strategy

    method = getattr(current_strategy(), "replica_fingerprint", None)
    if method is None:
        return None
    names, numels, values = method()
    return (names, numels, values.tolist()) if names else None


def _mark_cell_start(filename: str) -> None:
    """Mark the cell's start on the engine strategy's timeline (the dashboard draws it)."""
    from nbdist.cluster.engine_side.state import current_strategy

    telemetry = getattr(getattr(current_strategy(), "extended", None), "telemetry", None)
    if telemetry is not None:
        telemetry.mark(f"cell {filename.rpartition('-')[2].removesuffix('>')}")


def show_figures() -> None:
    """Display the open matplotlib figures as PNG images and close them (like `inline`).

    The engines draw with the Agg backend; `display` publishes each image, ipyparallel
    collects it with the request's outputs, and the notebook republishes it.
    """
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    numbers = pyplot.get_fignums()
    if not numbers:
        return
    import io

    from IPython.display import Image, display

    try:
        for number in numbers:
            buffer = io.BytesIO()
            pyplot.figure(number).savefig(buffer, format="png", bbox_inches="tight")
            display(Image(data=buffer.getvalue(), format="png"))
    finally:
        pyplot.close("all")


def _silenced(code: str) -> bool:
    """IPython's rule: a cell ending in `;` displays nothing."""
    lines = [line for line in code.rstrip().splitlines() if not line.lstrip().startswith("#")]
    return bool(lines) and lines[-1].rstrip().endswith(";")
