"""`nd.progress` on an engine: a tqdm bar that publishes its state instead of printing it.

Runs on the engine. A text bar written to the engine's stderr cannot be shown in the notebook:
tqdm redraws with `\\r` and no newline, so the notebook's line-by-line relay has nothing to print
until the loop ends, and ipyparallel's client then cuts the text at the last `\\r` (a 0 % bar
with leftover characters). Instead, `EngineBar` sends its state (count, total, description,
elapsed time) with ipyparallel's data publication (a `data_message` on IOPub, attached to the
request the engine is running), at most every `mininterval` s and once when it closes; the
notebook's half (`nbdist.magics._progress`) draws one bar per loop from the first replica the
cell runs on, as a widget in JupyterLab and as a text bar in a terminal.

Every replica publishes (a few hundred bytes, five times a second at most); the notebook shows
the first target's bar only, so other replicas' iterations are not counted.

Example (on an engine; elsewhere publishing does nothing)::

    from nbdist.cluster.engine_side.progress import EngineBar
    for batch in EngineBar(range(3), desc="training"):
        pass
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any

from tqdm.std import tqdm

__all__ = ["PROGRESS_KEY", "EngineBar", "bars", "reset_bars"]

PROGRESS_KEY = "nbdist_progress"
_KEEP = 50  # bars kept per cell (the newest); a reader that polls slower misses older ones
_MININTERVAL_S = 0.2  # the notebook reads them every 0.2 s: faster sends are never drawn
_ids = itertools.count(1)
_lock = threading.Lock()
_bars: dict[int, dict[str, Any]] = {}


class _Nowhere:
    """A file for tqdm that keeps nothing (the state goes out by `publish`, not as text)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


def bars() -> dict[int, dict[str, Any]]:
    """A copy of this cell's bar states, by bar id (what the next message carries)."""
    with _lock:
        return {key: dict(value) for key, value in _bars.items()}


def reset_bars() -> None:
    """Forget the previous cell's bars (called as a `%%distribute` cell starts)."""
    with _lock:
        _bars.clear()


def _publish() -> None:
    from ipyparallel.datapub import publish_data

    publish_data({PROGRESS_KEY: bars()})


class EngineBar(tqdm):
    """A tqdm bar whose every redraw publishes its state to the notebook instead of text.

    Example (on an engine)::

        for batch in EngineBar(batches, desc="epoch 0"):
            ...
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["file"] = _Nowhere()
        kwargs.setdefault("mininterval", _MININTERVAL_S)
        self._bar_id = next(_ids)
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Publish the bar's state (tqdm calls this for every redraw and when closing)."""
        if self.disable and not getattr(self, "_nbdist_closing", False):
            return True
        info = self.format_dict
        state = {
            "n": int(info["n"]) if float(info["n"]).is_integer() else float(info["n"]),
            "total": info["total"],
            "desc": info.get("prefix") or "",
            "unit": info.get("unit", "it"),
            "unit_scale": info.get("unit_scale", False),
            "unit_divisor": info.get("unit_divisor", 1000),
            "postfix": info.get("postfix") or "",
            "elapsed": float(info["elapsed"]),
            "leave": self.leave is not False,
            "closed": bool(getattr(self, "_nbdist_closing", False)),
        }
        with _lock:
            _bars[self._bar_id] = state
            while len(_bars) > _KEEP:
                _bars.pop(next(iter(_bars)))
        with contextlib.suppress(Exception):  # not on an engine (a plain process): no one reads
            _publish()
        return True

    def close(self) -> None:
        """Close the bar; its last redraw is published marked closed."""
        if not self.disable:
            self._nbdist_closing = True
        super().close()
