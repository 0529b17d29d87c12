"""`nd.dashboard()`: one widget with four views (placement, reductions, training, engines)
under a live summary line, that updates itself while cells run.

Views are drawn with matplotlib's Agg canvas into `ipywidgets.Image` (tables as `HTML`): that
is what reaches the page while the kernel is busy. Tabs switch in the browser; the widget opens
on Training, the view that changes while training runs. One refresher thread collects the
numbers about once a second, redraws only the views whose data changed, groups the updates
with `hold_sync()`, and waits longer between refreshes when drawing costs much CPU (at most 2 %
of a core is spent refreshing while the replicas run in this process, 20 % while they run on
engines; counted in CPU time, so a loaded machine, which stretches the wall time of a refresh,
does not slow the refreshes down).

When its cluster stops (`%dist stop`, `cluster.stop()`) the dashboard freezes: it stops
refreshing and leaves its last state as one picture in the output (`freeze()`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets

from nbdist.telemetry.timeline import chrome_trace
from nbdist.widgets._canvas import new_figure, png_bytes
from nbdist.widgets._data import DashboardData, source_for
from nbdist.widgets.engines import EnginesView, engines_html
from nbdist.widgets.placement import PlacementView
from nbdist.widgets.reductions import ReductionsView, draw_reductions
from nbdist.widgets.summary import summary_html, summary_text
from nbdist.widgets.training import TrainingView, draw_training

__all__ = ["Dashboard", "dashboard", "draw_dashboard"]

_INTERVAL_S = 1.0
_MAX_INTERVAL_S = 10.0
_LOOK_S = 0.1
"""How often the refresher asks its source whether anything is new (cheap): new records are
drawn as soon as they arrive, once `_period()` has passed since the last refresh began."""
_IDLE_S = 2.0
"""With nothing new, a refresh still runs this often (engine states, "last heard")."""
_DRAW_SHARE = 0.02
"""At most this share of a core goes to refreshing (collect + draw, CPU time) while the
replicas run in this process (an in-process strategy): training shares its CPU and GIL with
the refresher, and issue 9 allows the dashboard 3 % of it
(benchmarks/bench_dashboard_overhead.py). With ~100 ms refreshes (reductions, training,
collect) that is one every 5 s."""
_DRAW_SHARE_ENGINES = 0.2
"""The same while the replicas run on engines (other processes): drawing here takes nothing
from their GIL, only a share of a core."""
_TRAINING_TAB = 2  # the view that changes while training runs: the one the widget opens on


def draw_dashboard(fig: Any, data: DashboardData, title: str = "nbdist dashboard") -> None:
    """Draw every view into one figure (what `save` writes, `freeze` leaves in the output and
    `nbdist demo` shows): `title` and the summary line on top."""
    head, top, middle, bottom = fig.subfigures(4, 1, height_ratios=[0.3, 1, 3, 1.6])
    line = summary_text(data)
    head.text(0.5, 0.8, title, ha="center", va="top", fontsize=11, fontweight="bold")
    head.text(0.5, 0.3, line, ha="center", va="top", fontsize=9,
              color="#e63946" if "diverge" in line else "black")  # fmt: skip
    ax = top.subplots()
    ax.axis("off")
    rows = [
        [str(e.replica), e.state, str(e.host), str(e.pid), str(e.device)] for e in data.engines
    ] or [["–", "no engines", "", "", ""]]
    held = {r: sum(i["bytes"] for i in items) for r, items in data.holdings.items()}
    for row in rows:
        row.append(str(held.get(int(row[0]) if row[0].isdigit() else -1, "")))
    table = ax.table(
        rows, colLabels=["replica", "state", "host", "pid", "device", "bytes held"],
        loc="center", cellLoc="center",
    )  # fmt: skip
    table.scale(1, 1.2)
    for (r, c), cell in table.get_celld().items():
        if r > 0 and c == 1 and rows[r - 1][1] == "dead":
            cell.set_facecolor("#e63946")
    top.suptitle("Engines and placement", fontsize=10)
    middle.suptitle("Reductions", fontsize=10)
    draw_reductions(middle, data)
    bottom.suptitle("Training", fontsize=10)
    draw_training(bottom, data)


class Dashboard(ipywidgets.VBox):
    """The live dashboard widget (see `nd.dashboard`)."""

    def __init__(
        self,
        target: Any = None,
        *,
        interval: float = _INTERVAL_S,
        live: bool = True,
        namespace: dict | None = None,
    ):
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source = source_for(target)
        if namespace is not None and hasattr(self.source, "namespace"):
            self.source.namespace = namespace
        self.placement = PlacementView()
        self.reductions = ReductionsView()
        self.training = TrainingView()
        self.engines = EnginesView()
        self.views = (self.placement, self.reductions, self.training, self.engines)
        self.tabs = ipywidgets.Tab(children=[v.widget for v in self.views])
        for i, view in enumerate(self.views):
            self.tabs.set_title(i, view.title)
        self.tabs.selected_index = _TRAINING_TAB
        self.header = ipywidgets.HTML()
        self.line = ipywidgets.HTML()
        """The live summary line above the tabs (step, loss, steps/s, last all-reduce, the
        replica check); `summary` is the same as plain text."""
        self.line.add_class("nd-summary")
        super().__init__(children=[self.header, self.line, self.tabs])
        self.add_class("nd-dashboard")
        self.data = DashboardData()
        self.frozen = False
        """True once `freeze()` left the last state as a picture (nothing refreshes then)."""
        self.interval = interval
        self.refreshes = 0
        self.last_draw_s = 0.0
        self.last_refresh_s = 0.0
        self.last_refresh_cpu_s = 0.0
        self.busy_s = 0.0
        """Seconds spent refreshing (collect + draw) since the dashboard opened."""
        self.busy_cpu_s = 0.0
        """CPU seconds of the threads that refreshed, over the same refreshes."""
        self._lock = threading.Lock()
        self._freezing = threading.Lock()  # held for the whole of freeze()
        self.history: collections.deque[tuple] = collections.deque(maxlen=1000)
        """Per refresh: (monotonic time, collectives shown, metrics shown, from the thread,
        wall seconds it took, CPU seconds it took)."""
        self._shell = None
        self._display: Any = None
        self.refresh()
        try:
            from IPython import get_ipython

            self._shell = get_ipython()
        except ImportError:
            pass
        if self._shell is not None:
            self._shell.events.register("post_run_cell", self._after_cell)
        if live:
            self._thread = threading.Thread(target=self._loop, name="nbdist-dashboard", daemon=True)
            self._thread.start()

    def refresh(self, *, in_thread: bool = False) -> DashboardData:
        """Collect the numbers now and redraw what changed; returns the data shown."""
        with self._lock:
            if self.frozen:
                return self.data
            collecting, cpu = time.perf_counter(), time.thread_time()
            data = self.source.collect(in_thread=in_thread)
            started = time.perf_counter()
            with self.hold_sync():
                changed = [view.update(data) for view in self.views]
                states = [e.state for e in data.engines]
                self.header.value = (
                    f"<b>nbdist dashboard</b> — {len(states)} replica(s): "
                    + ", ".join(f"{s} {states.count(s)}" for s in ("alive", "busy", "dead"))
                    + f" · {len(data.collectives)} collectives · refresh #{self.refreshes + 1}"
                )
                self.line.value = summary_html(data)
            self.last_draw_s = time.perf_counter() - started
            self.last_refresh_s = time.perf_counter() - collecting
            self.last_refresh_cpu_s = time.thread_time() - cpu
            self.busy_s += self.last_refresh_s
            self.busy_cpu_s += self.last_refresh_cpu_s
            self.refreshes += 1
            self.history.append(
                (time.monotonic(), len(data.collectives), len(data.metrics), in_thread,
                 self.last_refresh_s, self.last_refresh_cpu_s)
            )  # fmt: skip
            self.data = data
            self.changed = changed
            return data

    def _period(self) -> float:
        """Seconds from one refresh's start to the next: `interval`, or longer when
        refreshing (as costly in CPU time as the last one was) would take more than
        `_DRAW_SHARE` of a core. CPU time, not wall time: on a loaded machine a refresh waits
        for a core far longer than it computes, and that waiting costs nobody anything."""
        share = _DRAW_SHARE if getattr(self.source, "in_process", True) else _DRAW_SHARE_ENGINES
        return min(max(self.interval, self.last_refresh_cpu_s / share), _MAX_INTERVAL_S)

    def _source_stopped(self) -> bool:
        """True once the cluster shown has been stopped (`%dist stop`, `cluster.stop()`)."""
        cluster = getattr(self.source, "cluster", None)
        return cluster is not None and not cluster.running

    def _loop(self) -> None:
        began = time.monotonic()  # the first refresh (in __init__) says what one costs
        seen = self._version()
        while not self._stop.wait(_LOOK_S):
            try:
                now = time.monotonic()
                if now - began < self._period():
                    continue
                version = self._version()
                if version == seen and now - began < _IDLE_S:
                    continue
                if self._source_stopped():
                    if self._freezing.acquire(blocking=False):  # else the kernel's thread is
                        self._freezing.release()  # freezing it (and waits for this thread)
                        self.freeze()
                    return
                began, seen = now, version
                self.refresh(in_thread=True)
            except Exception as error:  # keep the view alive; say what went wrong
                self.header.value = f"<b>nbdist dashboard</b>: refresh failed: {error!r}"

    def _version(self) -> Any:
        version = getattr(self.source, "version", None)
        return version() if version is not None else None

    def _after_cell(self, result: Any = None) -> None:
        """Pull what is new from the engines between cells (on the kernel's thread); once the
        cluster has stopped, freeze (waiting for a freeze the refresher thread began)."""
        try:
            if self._source_stopped():
                self.freeze()
            elif not self._stop.is_set():
                self.refresh()
        except Exception as error:  # never break the user's next cell
            self.header.value = f"<b>nbdist dashboard</b>: refresh failed: {error!r}"

    def _quiet(self, *, after_cell: bool = True) -> None:
        """Stop the refresher thread and (unless `after_cell` is False) the after-cell
        refresh."""
        self._stop.set()
        if after_cell:
            shell, self._shell = getattr(self, "_shell", None), None
            if shell is not None:
                with contextlib.suppress(ValueError):
                    shell.events.unregister("post_run_cell", self._after_cell)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=_MAX_INTERVAL_S + 5)

    def show(self) -> Dashboard:
        """Display the dashboard in the notebook, so that `freeze()` can later put its last
        picture in the same output (what `%dist dashboard` does)."""
        from IPython.display import display

        self._display = display(self, display_id=True)
        return self

    def freeze(self) -> None:
        """Stop refreshing and leave the last state as one picture (every view, the summary
        on top) where the widget was: the output keeps the charts after the engines are gone.

        Called by `%dist stop`, and by the dashboard itself once its cluster has stopped.
        Example:
            >>> import nbdist as nd
            >>> board = nd.dashboard(nd.MirroredStrategy(["cpu:0", "cpu:1"]))
            >>> board.freeze(); board.frozen, len(board.children)
            (True, 2)
        """
        with self._freezing:
            if not self.frozen:
                self._freeze()

    def _freeze(self) -> None:
        # The after-cell hook stays until the picture is in place: a cell that stopped the
        # cluster while the refresher thread froze the dashboard waits for it to finish.
        self._quiet(after_cell=False)
        stopped = time.strftime("%H:%M:%S")
        image = self.picture(f"nbdist dashboard — stopped at {stopped}")
        self.header.value = (
            f"<b>nbdist dashboard</b> — stopped at {stopped}; the last state it showed:"
        )
        picture = ipywidgets.Image(value=image, format="png")
        picture.add_class("nd-final")
        tabs = self.tabs
        with self.hold_sync():
            self.children = [self.header, picture]
        for view in self.views:
            for child in getattr(view.widget, "children", ()):
                child.close()
            view.widget.close()
        tabs.close()
        self.line.close()
        with self._lock:
            self.frozen = True
        self._quiet()
        if self._display is not None:  # a picture saved with the notebook, not widget state
            self._display.update(
                {"image/png": image, "text/plain": f"nbdist dashboard, stopped at {stopped}"},
                raw=True,
            )

    @property
    def summary(self) -> str:
        """The summary line as plain text, for `print`: step, loss (the replicas' mean),
        steps/s, the last all-reduce and the newest replica check.

        Example:
            >>> import nbdist as nd
            >>> nd.telemetry.metrics.metric_log().clear()  # what other examples logged
            >>> board = nd.dashboard(nd.MirroredStrategy(["cpu:0", "cpu:1"]))
            >>> board.summary
            'no metrics yet: nd.log(loss=...) in the loop draws curves'
            >>> board.close()
        """
        return summary_text(self.data)

    def close(self) -> None:
        """Stop refreshing and close the widget (it disappears from the output; `freeze()`
        leaves its last picture instead)."""
        self._quiet()
        super().close()

    def picture(self, title: str = "nbdist dashboard") -> bytes:
        """Every view as one PNG, `title` on top."""
        data = self.data if self.refreshes else self.refresh()
        fig = new_figure(10, 11.5)
        draw_dashboard(fig, data, title)
        return png_bytes(fig, compress_level=6)

    def save(self, path: str | os.PathLike) -> Path:
        """Write every view as one PNG picture to `path`.

        Raises:
            OSError: The path cannot be written, naming it.
        """
        path = Path(path)
        image = self.picture()
        try:
            path.write_bytes(image)
        except OSError as error:
            from nbdist.errors import FileWriteError

            raise FileWriteError(
                f"Could not save the dashboard to {str(path)!r}: {error.strerror or error}. "
                "Choose a folder you can write to, e.g. dashboard.save('dashboard.png')."
            ) from None
        return path

    def export_trace(self, path: str | os.PathLike) -> Path:
        """Write the timeline (collectives and steps per replica) in the Chrome/Perfetto trace
        format; open it at ui.perfetto.dev or chrome://tracing."""
        data = self.data if self.refreshes else self.refresh()
        chrome_trace(data.collectives, data.steps, path)
        return Path(path)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict) and self.refreshes:
            bundle["image/png"] = self.picture()  # the picture stays when widget state is gone
            bundle["text/plain"] = "nbdist dashboard"
        return bundle


def dashboard(target: Any = None) -> Dashboard:
    """The live dashboard of the running cluster, else of the current strategy.

    Args:
        target: A strategy or an `nd.Cluster`; None picks the `%dist start` cluster, else the
            current strategy (the default one outside any scope).

    Example:
        >>> import nbdist as nd
        >>> board = nd.dashboard(nd.MirroredStrategy(["cpu:0", "cpu:1"]))
        >>> [e.replica for e in board.data.engines]
        [0, 1]
        >>> board.close()
    """
    return Dashboard(target)


__all__ += ["engines_html"]
