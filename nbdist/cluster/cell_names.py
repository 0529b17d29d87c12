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

__all__ = ["numbered_like_the_editor", "remember", "rename", "rename_pdb"]

_LIMIT = 1000  # cells remembered (the oldest is forgotten first)
_names: dict[str, int] = {}
_FILE = re.compile(r'File "([^"]+)", line (\d+)')


def numbered_like_the_editor(filename: str, cell: str, source: str) -> str:
    """`source` (a `%%distribute` cell's body `cell`, as Python) numbered as the editor numbers
    the cell, and `filename` named after the cell's prompt (`Cell In[6]`) in tracebacks.

    The body gets one empty line per line above it in the cell (the `%%distribute` line),
    none when `%dist auto on` made the cell a `%%distribute` cell (the editor shows no such
    line). A body that is not the cell IPython runs now (`distribute_cell` called from
    code) keeps its own numbering and name.
    """
    count, above = _current_cell(cell)
    remember(filename, count)
    return "\n" * above + source


def _current_cell(body: str) -> tuple[int | None, int]:
    """`(execution count, lines above body)` of the cell IPython runs now, if `body` is its
    `%%distribute` body; `(None, 0)` otherwise."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    raw = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if not raw or len(raw) < 2:
        return None, 0
    # The number the history stored the cell under: `shell.execution_count` is already the
    # next cell's in IPython 9 (still this one's in IPython 8).
    count = len(raw) - 1
    lines = str(raw[-1]).splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return None, 0
    if lines[first].lstrip().startswith("%%distribute"):
        if "\n".join(lines[first + 1 :]).strip() == body.strip():
            return count, first + 1
        return None, 0
    return (count, 0) if str(raw[-1]).strip() == body.strip() else (None, 0)


def remember(filename: str, count: int | None) -> None:
    """Name `filename` (a `%%distribute` cell's) `Cell In[count]` in tracebacks."""
    if count is None:
        return
    _names[filename] = count
    while len(_names) > _LIMIT:
        del _names[next(iter(_names))]


_PDB_FILE = re.compile(r"(?m)^([> ] )(\S.*?)\((\d+)\)")


def rename_pdb(text: str) -> str:
    """`text` (pdb's output on an engine) with every notebook cell's file named as the editor
    names the cell: `> <distribute-cell-1>(6)<module>()` becomes `> Cell In[6](6)<module>()`
    (also a function defined in a notebook cell, named by the kernel's file for it).

    Example:
        >>> remember("<distribute-cell-2>", 7)
        >>> rename_pdb("> <distribute-cell-2>(3)<module>()")
        '> Cell In[7](3)<module>()'
    """
    kernel = _kernel_label()

    def name(match: re.Match[str]) -> str:
        lead, filename, line = match.groups()
        label = f"Cell In[{_names[filename]}]" if filename in _names else kernel(filename)
        return match.group(0) if label is None else f"{lead}{label}({line})"

    return _PDB_FILE.sub(name, text)


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
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    format_name = getattr(getattr(shell, "compile", None), "format_code_name", None)

    def label(filename: str) -> str | None:
        if format_name is None:
            return None
        try:
            found = format_name(filename)
        except Exception:
            return None
        return " ".join(found) if found else None

    return label
