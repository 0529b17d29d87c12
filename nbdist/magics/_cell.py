"""Running one notebook cell on the engines at once (`%%distribute`): both halves.

`run_cell` runs on each engine: it executes the cell's Python code in the engine's interactive
namespace (so names persist between cells, and `strategy`, `nd`, `torch` are there) and
evaluates a final expression, IPython-style. It never raises: it replies with a dict as
`nbdist.cluster.engine_side.calls` does (`{"ok": True, "value": pickled}` or `_wire.failure`).

`distribute_cell` is the notebook's half: it checks the cell's syntax here (one SyntaxError,
not one per engine), sends it, prints the engines' output live, prefixed by replica id, and
waits under the same supervision as `cluster.strategy.run` (an engine that failed while its
peers are blocked in a collective releases them; Ctrl-C and timeouts interrupt the engines).

Each engine's reply carries the fingerprint of its mirrored parameters (Note [Replica check]
in `nbdist.strategies._replica_check`), and the notebook compares them once the cell has run
everywhere: no collective among the engines (a cell that failed on one engine cannot leave the
others waiting in it), and parameters that differ raise `ReplicasDivergedError` here.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from nbdist.cluster import _wire, cell_names
from nbdist.cluster.calls import Supervisor, checked_replies, say_late_output, wait_for_outputs
from nbdist.cluster.engine_side.progress import reset_bars
from nbdist.cluster.errors import EngineTimeoutError, SerializationError
from nbdist.cluster.sigint import interrupts_deferred
from nbdist.magics._progress import CellBars
from nbdist.values import PerReplica

if TYPE_CHECKING:
    from nbdist.cluster.engines import Cluster
    from nbdist.cluster.status import EngineInfo

__all__ = ["OUTPUT_MODES", "distribute_cell", "python_source", "run_cell", "show_figures"]

OUTPUT_MODES = ("all", "first", "none")
_POLL_S = 0.2
_WHAT = "a %%distribute cell"
_counter = itertools.count(1)


# -- on the engines ----------------------------------------------------------------------------
def run_cell(code: str, filename: str) -> dict[str, Any]:
    """Execute `code` in the engine's namespace; reply with the last expression's value."""
    import linecache

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
        with watched_call():
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


# -- in the notebook ---------------------------------------------------------------------------
def python_source(cell: str) -> str:
    """The cell as plain Python (IPython syntax such as `%time` or `!ls` transformed)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(cell)


class _Streams:
    """Prints what each engine printed, line by line, prefixed by its replica id, and
    republishes what it displayed (plots, HTML) as it arrives."""

    def __init__(self, engines: Sequence[EngineInfo], parts: list[Any], mode: str):
        self.engines = list(engines)
        self.parts = parts
        self.mode = mode
        self.bars = CellBars(parts[0])  # nd.progress: the first target's bars, in every mode
        self.seen: dict[tuple[int, str], int] = {}
        self.pending: dict[tuple[int, str], str] = {}
        self.displayed: dict[int, int] = {}

    def poll(self, final: bool = False) -> None:
        self._poll_streams(final)
        if not final:
            self.bars.poll()

    def _poll_streams(self, final: bool) -> None:
        if self.mode == "none":
            return
        for index, (info, part) in enumerate(zip(self.engines, self.parts)):
            if self.mode == "first" and index != 0:
                continue
            for name in ("stdout", "stderr"):
                text = _stream_text(part, name)
                key = (info.rank, name)
                new = text[self.seen.get(key, 0) :]
                self.seen[key] = len(text)
                buffer = self.pending.get(key, "") + new
                *lines, rest = buffer.split("\n")
                if final and rest:
                    lines.append(rest)
                    rest = ""
                self.pending[key] = rest
                stream: TextIO = sys.stdout if name == "stdout" else sys.stderr
                if lines:
                    with self.bars.writing(stream):
                        for line in lines:
                            print(f"[{info.rank}] {line}", file=stream)
                        stream.flush()
            self._republish(info.rank, part)

    def _republish(self, rank: int, part: Any) -> None:
        from IPython.display import publish_display_data

        outputs = _display_outputs(part)
        for output in outputs[self.displayed.get(rank, 0) :]:
            data = output.get("data") or {}
            if data:
                publish_display_data(data, output.get("metadata") or {})
        self.displayed[rank] = len(outputs)


def _display_outputs(part: Any) -> list[dict[str, Any]]:
    try:
        outputs = part.outputs
    except Exception:
        return []
    if outputs and isinstance(outputs[0], list):  # a multi-engine result: one list per engine
        outputs = outputs[0]
    return list(outputs or [])


def _stream_text(part: Any, name: str) -> str:
    try:
        text = getattr(part, name)
    except Exception:
        return ""
    if isinstance(text, list):
        text = "".join(t or "" for t in text)
    return text or ""


def distribute_cell(
    cluster: Cluster,
    cell: str,
    *,
    targets: Sequence[int] | None = None,
    output: str = "all",
    timeout: float | None = None,
) -> PerReplica | None:
    """Run `cell` on the engines of replicas `targets` (default: all) at once.

    Returns:
        The last expression's values as a `PerReplica` carrying the targets' replica ids, in
        replica order (`--targets 1,0` gives `PerReplica:{0: ..., 1: ...}`, `--targets 1`
        gives `PerReplica:{1: ...}`), or None when the cell ends with a statement (or every
        engine's value is None).

    Raises:
        SyntaxError: the cell is not valid Python (checked here, before sending).
        WorkerLostError: an engine is dead; `%dist restart` recovers.
        RemoteError: one or more engines raised (one error for all of them).
        ClusterUnusableError: an earlier fault left the cluster unusable (nothing was sent).
        EngineTimeoutError: not finished within `timeout` s (the engines were interrupted;
            the message says whether the cluster is still usable).
        ClusterInterrupted: (a `KeyboardInterrupt`) Ctrl-C; the engines were interrupted, and
            the one-line message says what each was doing and whether the cluster is usable.
    """
    if output not in OUTPUT_MODES:
        from nbdist.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"output must be one of {OUTPUT_MODES}, got {output!r}; e.g. output='all'."
        )
    filename = f"<distribute-cell-{next(_counter)}>"
    source = cell_names.numbered_like_the_editor(filename, cell, python_source(cell))
    compile(source, filename, "exec")  # raised once, here, not by every engine
    with cluster.turn("The cell", timeout) as deadline:  # Note [One call at a time]
        engines = list(cluster.engines)
        if targets is not None:
            by_rank = {info.rank: info for info in engines}
            engines = [by_rank[rank] for rank in sorted(targets)]
        cluster.require_alive("the cell", fix="`%dist restart`")
        left = cluster.time_left("The cell", timeout, deadline)
        cluster.require_usable("The cell", fix="`%dist restart`", wait=left)
        cluster.time_left("The cell", timeout, deadline)
        return _run_cell(cluster, engines, source, filename, output, timeout, deadline)


def _run_cell(
    cluster: Cluster,
    engines: list[EngineInfo],
    source: str,
    filename: str,
    output: str,
    timeout: float | None,
    deadline: float | None,
) -> PerReplica | None:
    """Send the cell to `engines` and wait for them until `deadline` (`timeout` s after the
    cell began to wait for its turn); the body of `distribute_cell`."""
    client = cluster.client
    ids = [info.id for info in engines]
    result = client.direct_view(ids).apply_async(run_cell, source, filename)
    parts = list(result.split()) if len(ids) > 1 else [result]
    for info, part in zip(engines, parts):
        cluster.track_request(info.id, part)
    chosen = {info.rank for info in engines}
    others = [info for info in cluster.engines if info.rank not in chosen]
    supervisor = Supervisor(cluster, engines, parts, _WHAT, bystanders=others)
    streams = _Streams(engines, parts, output)
    try:
        while True:
            step = _POLL_S
            if deadline is not None:
                step = min(step, max(0.0, deadline - time.monotonic()))
            if supervisor.wait(step):
                break
            with interrupts_deferred():  # never inside ipykernel's flush: raised right after
                streams.poll()
            if deadline is not None and time.monotonic() >= deadline:
                pending, detail = supervisor.stop_after_timeout(timeout, "`%dist restart`")
                _finish_output(parts, streams)
                raise EngineTimeoutError(
                    f"The cell did not finish within {timeout:g} s on replica(s) {pending}; "
                    f"they were interrupted.{detail} Raise --timeout for longer work.",
                    pending=tuple(pending),
                )
    except KeyboardInterrupt:
        error = supervisor.interrupted("`%dist restart`")
        _finish_output(parts, streams)
        raise error from None
    _finish_output(parts, streams)
    replies = checked_replies(cluster, engines, parts, supervisor, _WHAT, fix="`%dist restart`")
    check_replicas(cluster, [info.rank for info in engines], replies)
    values = []
    for info, reply in zip(engines, replies):
        try:
            values.append(_wire.loads(reply["value"]))
        except Exception as error:
            raise SerializationError(
                f"The value of replica {info.rank}'s last expression cannot be unpickled in the "
                f"notebook: {type(error).__name__}: {error}. End the cell with tensors, numbers "
                "or containers of them."
            ) from error
    if all(value is None for value in values):
        return None
    return PerReplica(values, replica_ids=[info.rank for info in engines])


def check_replicas(cluster: Cluster, ranks: list[int], replies: list[dict[str, Any]]) -> None:
    """Compare the engines' fingerprints of their mirrored parameters (Note [Replica check]);
    record the outcome for the dashboard on `cluster.last_replica_check`.

    Raises:
        ReplicasDivergedError: some replica's parameters differ from the others'.
    """
    prints = [reply.get("fingerprint") for reply in replies]
    if len(prints) < 2 or any(p is None for p in prints):
        return
    names, numels = prints[0][0], prints[0][1]
    if any(p[0] != names for p in prints):
        return  # different models on different engines: nothing to compare
    import torch

    from nbdist.errors import ReplicasDivergedError
    from nbdist.strategies._replica_check import differing, diverged_message

    values = torch.tensor([p[2] for p in prints], dtype=torch.float64)
    bad = differing(values.amax(0), values.amin(0), numels)
    if not bad:
        cluster.last_replica_check = (time.time(), True, "")
        return
    first = values[0]
    others = [
        rank
        for rank, mine in zip(ranks[1:], values[1:])
        if differing(torch.maximum(first, mine), torch.minimum(first, mine), numels)
    ]
    message = diverged_message(
        names, bad, "at the end of the %%distribute cell",
        f" (replica(s) {others} differ from replica {ranks[0]})",
    )  # fmt: skip
    cluster.last_replica_check = (time.time(), False, message)
    raise ReplicasDivergedError(message)


def _finish_output(parts: list[Any], streams: _Streams) -> None:
    """Print the rest of what the engines printed, once it is here (Note [Output after the
    reply] in `nbdist.cluster.calls`), and draw the progress bars' last states."""
    # the first target's bars are drawn in every mode: their last state comes with its output
    shown = len(parts) if streams.mode == "all" else 1
    late = wait_for_outputs(parts[:shown], streams.engines[:shown])
    streams.poll(final=True)
    streams.bars.finish()
    if streams.mode != "none":
        say_late_output(late)
