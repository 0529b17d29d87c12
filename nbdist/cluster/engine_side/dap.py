"""The engine's half of JupyterLab's visual debugger on replicas: line breakpoints in a
`%%distribute` cell, and the frames and variables of a stopped replica as data.

Runs on the engine. Note [The visual debugger on replicas]: JupyterLab sends its gutter
breakpoints to the notebook's kernel (`setBreakpoints` on the cell's file); the kernel
(`nbdist.magics._visual_debugger`) sends the lines of the cell it runs with the cell
(`run_cell(code, filename, lines)`), and `line_breaks` sets them as pdb breakpoints of a
`NotebookPdb` whose channel attaches only when a replica stops (`debugger._LazyChannel`,
announced with `"visual": true`). The stopped replica then waits in pdb as for
`breakpoint()`, held (its peers' collective timeouts pause), and the kernel's bridge speaks
for it in the Debug Adapter Protocol: it sends pdb commands (`c`, `n`, `s`, `r`) as the
prompt does, and queries that `Inspector` answers while pdb waits:

- `{"q": "stack"}`: the user's frames, innermost first: `{"index", "name", "file", "line"}`
  (`index` into pdb's stack);
- `{"q": "scopes", "frame": index}`: `[{"name": "Locals"|"Globals", "ref"}]`;
- `{"q": "variables", "ref": ref}`: `[{"name", "value", "type", "ref"}]` (`ref` 0: no
  children);
- `{"q": "evaluate", "frame": index, "expression": text}`: `{"value", "type", "ref"}` or
  `{"error": text}`;
- `{"q": "release"}`: forget every breakpoint (the visual debugger was switched off).

Refs hold until the replica moves on (the next stop starts afresh).

Example (on an engine, what `run_cell` does)::

    with line_breaks("<distribute-cell-3>", [4, 6]):
        exec(code, namespace)      # stops before line 4 and line 6 on every replica
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import reprlib
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

from nbdist.errors import ContextError

__all__ = ["Inspector", "line_breaks"]

_VALUE_CHARS = 200
_CHILDREN = 300  # items of a container shown at most
_HIDDEN = {"In", "Out", "exit", "quit", "get_ipython", "open"}  # IPython puts them in
_MOVED_ON = (
    "No {what} here: the replica has moved on since; click its frame in the Callstack panel "
    "again to see where it is now."
)
_repr = reprlib.Repr()
_repr.maxstring = _VALUE_CHARS
_repr.maxother = _VALUE_CHARS


@contextlib.contextmanager
def line_breaks(filename: str, lines: Sequence[int]) -> Iterator[None]:
    """Stop every replica that reaches one of `lines` of `filename` (a `%%distribute` cell's
    file) while the block runs, in the visual debugger; a no-op without lines."""
    if not lines:
        yield
        return
    from nbdist.cluster.engine_side.debugger import end_session, visual_session

    session = visual_session()
    session.channel.inspector = Inspector(session, filename)
    session.reset()
    for line in sorted({int(n) for n in lines}):
        session.set_break(filename, line)  # a blank line or comment: pdb refuses, never stops
    session.botframe = inspect.currentframe()  # (bdb) never stops here: runs to a breakpoint
    session.set_continue()
    sys.settrace(session.trace_dispatch)
    try:
        yield
    finally:
        sys.settrace(None)
        end_session(session)


class Inspector:
    """Answers the visual debugger's queries about a stopped `NotebookPdb`'s frames (see the
    module docstring)."""

    def __init__(self, session: Any, filename: str = ""):
        self.session = session
        self.filename = filename  # frames from its first one on are the user's call
        self.refs: dict[int, Any] = {}
        self._ids = itertools.count(1)

    def reset(self) -> None:
        """Forget the refs of the last stop."""
        self.refs.clear()

    def answer(self, query: dict[str, Any]) -> Any:
        """The answer to one query (`{"error": text}` when it cannot be answered)."""
        kind = query.get("q")
        try:
            if kind == "stack":
                return self._stack()
            if kind == "scopes":
                return self._scopes(int(query["frame"]))
            if kind == "variables":
                return self._variables(int(query["ref"]))
            if kind == "evaluate":
                return self._evaluate(int(query["frame"]), str(query["expression"]))
            if kind == "release":
                self.session.clear_all_breaks()
                return True
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}"}
        return {"error": f"unknown query {kind!r}"}

    def _frame(self, index: int) -> types.FrameType:
        stack = self.session.stack
        if not 0 <= index < len(stack):
            raise ContextError(_MOVED_ON.format(what=f"frame {index}"))
        return stack[index][0]

    def _stack(self) -> list[dict[str, Any]]:
        from nbdist.cluster.engine_side.debugger import _user_frame

        frames = []
        stack = self.session.stack
        first = next(
            (i for i, (f, _) in enumerate(stack) if f.f_code.co_filename == self.filename), 0
        )
        for index in range(len(stack) - 1, first - 1, -1):
            frame, line = self.session.stack[index]
            if _user_frame(frame):
                code = frame.f_code
                frames.append(
                    {"index": index, "name": code.co_name, "file": code.co_filename, "line": line}
                )
        return frames

    def _scopes(self, index: int) -> list[dict[str, Any]]:
        frame = self._frame(index)
        if frame.f_locals is frame.f_globals:  # a cell's top level: its names are the globals
            return [{"name": "Globals", "ref": self._ref(_Namespace(frame.f_globals))}]
        local = frame.f_locals if index != self.session.curindex else self.session.curframe_locals
        return [
            {"name": "Locals", "ref": self._ref(_Namespace(local))},
            {"name": "Globals", "ref": self._ref(_Namespace(frame.f_globals))},
        ]

    def _variables(self, ref: int) -> list[dict[str, Any]]:
        if ref not in self.refs:
            raise ContextError(_MOVED_ON.format(what=f"variables {ref}"))
        return [self._describe(name, value) for name, value in _children(self.refs[ref])]

    def _evaluate(self, index: int, expression: str) -> dict[str, Any]:
        frame = self._frame(index)
        local = frame.f_locals if index != self.session.curindex else self.session.curframe_locals
        value = eval(expression, frame.f_globals, local)  # noqa: S307  (the user's debugger)
        return self._describe(expression, value)

    def _describe(self, name: str, value: Any) -> dict[str, Any]:
        try:
            text = _repr.repr(value) if not _is_tensor(value) else _tensor(value)
        except Exception as error:
            text = f"<repr failed: {type(error).__name__}>"
        ref = self._ref(value) if _expandable(value) else 0
        return {"name": name, "value": text, "type": type(value).__name__, "ref": ref}

    def _ref(self, value: Any) -> int:
        ref = next(self._ids)
        self.refs[ref] = value
        return ref


class _Namespace(dict):
    """A frame's names, shown without IPython's and Python's own (`_`, `In`, modules)."""


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, _Namespace):
        return sorted(
            (name, item)
            for name, item in value.items()
            if not name.startswith("_")
            and name not in _HIDDEN
            and not isinstance(item, types.ModuleType)
        )[:_CHILDREN]
    if isinstance(value, dict):
        return [(repr(key), item) for key, item in itertools.islice(value.items(), _CHILDREN)]
    if isinstance(value, (list, tuple)):
        return [(str(i), item) for i, item in enumerate(value[:_CHILDREN])]
    if _is_tensor(value):
        return [("shape", tuple(value.shape)), ("dtype", str(value.dtype)),
                ("device", str(value.device))]  # fmt: skip
    names = getattr(value, "__dict__", None)
    if isinstance(names, dict):
        return [(name, item) for name, item in names.items() if not name.startswith("__")][
            :_CHILDREN
        ]
    return []


def _expandable(value: Any) -> bool:
    if isinstance(value, (str, bytes, int, float, complex, bool, type(None))):
        return False
    if isinstance(value, (dict, list, tuple)):
        return len(value) > 0
    return _is_tensor(value) or isinstance(getattr(value, "__dict__", None), dict)


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor(value: Any) -> str:
    if value.numel() <= 8:
        return repr(value)
    return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
