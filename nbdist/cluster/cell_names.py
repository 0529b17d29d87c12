"""Cells named in engine tracebacks as the notebook's editor names them: `Cell In[6], line 3`.

Runs in the notebook. A `%%distribute` cell runs on the engines under a file name of its own
(`<distribute-cell-4>`, unique per run, so an engine's linecache never mixes two cells), and a
function defined in a notebook cell carries the kernel's file name for that cell
(`/tmp/ipykernel_123/2840.py`). An engine's traceback names those files; `rename` turns each
into IPython's own name for the cell, with its execution count (the number in the prompt).

Line numbers need no change: `%%distribute` sends the cell with one empty line in place of its
`%%distribute` line (`numbered_like_the_editor`), so the engines count lines as the editor
does.

Example:
    >>> remember("<distribute-cell-1>", 6)
    >>> rename('  File "<distribute-cell-1>", line 3, in <module>')
    '  Cell In[6], line 3, in <module>'
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["execution_count", "numbered_like_the_editor", "remember", "rename"]

_LIMIT = 1000  # cells remembered (the oldest is forgotten first)
_names: dict[str, int] = {}
_FILE = re.compile(r'File "([^"]+)", line (\d+)')


def execution_count() -> int | None:
    """The number in the prompt of the cell IPython is running now (None outside IPython):
    the number its history stored the cell under (`shell.execution_count` is already the next
    cell's in IPython 9, still this one's in IPython 8)."""
    shell = _shell()
    raw = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if raw:
        return len(raw) - 1
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def remember(filename: str, count: int | None) -> None:
    """Name `filename` (a `%%distribute` cell's) `Cell In[count]` in tracebacks."""
    if count is None:
        return
    _names[filename] = count
    while len(_names) > _LIMIT:
        del _names[next(iter(_names))]


def numbered_like_the_editor(source: str) -> str:
    """A `%%distribute` cell's body, numbered as the editor numbers the cell: one empty line
    per line above the body (the `%%distribute` line), none when `%dist auto on` made the
    cell a `%%distribute` cell (the editor shows no such line)."""
    return "\n" * _lines_above_body() + source


def _lines_above_body() -> int:
    """How many lines of the cell being run come before the `%%distribute` cell's body."""
    raw = getattr(getattr(_shell(), "history_manager", None), "input_hist_raw", None)
    if not raw:
        return 1
    lines = str(raw[-1]).splitlines()
    for index, line in enumerate(lines):
        if line.strip():
            return index + 1 if line.lstrip().startswith("%%distribute") else 0
    return 1


def rename(text: str) -> str:
    """`text` (a traceback) with every notebook cell's file named `Cell In[N], line L`."""
    if 'File "' not in text:
        return text
    kernel = _kernel_label()

    def name(match: re.Match[str]) -> str:
        filename, line = match.group(1), match.group(2)
        if filename in _names:
            return f"Cell In[{_names[filename]}], line {line}"
        label = kernel(filename)
        return match.group(0) if label is None else f"{label}, line {line}"

    return _FILE.sub(name, text)


def _kernel_label() -> Callable[[str], str | None]:
    """IPython's label for one of its own cells' file names (`Cell In[5]`), else None."""
    format_name = getattr(getattr(_shell(), "compile", None), "format_code_name", None)

    def label(filename: str) -> str | None:
        if format_name is None:
            return None
        try:
            found = format_name(filename)
        except Exception:
            return None
        return " ".join(found) if found else None

    return label
