"""Completion and inspection answered from the engine's namespace, for Tab and Shift+Tab in a
`%%distribute` cell (the notebook's half: `nbdist.magics._complete`).

Runs on the engine, in its stack server's thread (`engine_side.stacks`), so it answers while a
cell runs: it only reads the namespace (names, `dir()` of objects reached through attribute
names, signatures and docstrings) and never calls user code other than attribute access.

Example (on an engine)::

    complete({"token": "mod"})        # {"matches": ["model", ...]}
    inspect_name({"name": "model"})   # {"found": True, "text": "Type: Linear ..."}
"""

from __future__ import annotations

import builtins
import inspect
import keyword
import re
from typing import Any

from nbdist.cluster.engine_side import state

__all__ = ["complete", "inspect_name"]

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_LIMIT = 500


def complete(request: dict[str, Any]) -> dict[str, Any]:
    """`{"matches": [...]}`: the names and attributes that complete `request["token"]`
    (`"mod"` -> `"model"`, `"model.we"` -> `"model.weight"`), in sorted order."""
    token = str(request.get("token", ""))
    namespace = state.namespace_or_empty()
    base, dot, prefix = token.rpartition(".")
    if dot:
        found = _find(base, namespace)
        if found is _MISSING:
            return {"matches": []}
        names = _attributes(found)
        matches = [f"{base}.{name}" for name in names if name.startswith(prefix)]
        if not prefix.startswith("_"):
            matches = [m for m in matches if not m.rpartition(".")[2].startswith("_")]
    else:
        if token and not token.isidentifier():
            return {"matches": []}
        names = set(namespace) | set(dir(builtins)) | set(keyword.kwlist)
        matches = [n for n in names if n.startswith(token)]
        if not token.startswith("_"):
            matches = [m for m in matches if not m.startswith("_")]
    return {"matches": sorted(matches)[:_LIMIT]}


def inspect_name(request: dict[str, Any]) -> dict[str, Any]:
    """`{"found": bool, "text": ...}`: the type, value, signature and docstring of
    `request["name"]` (a name or dotted attribute path) in the engine's namespace."""
    name = str(request.get("name", ""))
    found = _find(name, state.namespace_or_empty())
    if found is _MISSING:
        return {"found": False}
    lines = [f"Type:           {type(found).__name__}"]
    with _quiet():
        text = repr(found)
        lines.append(f"String form:    {text[:500]}{'...' if len(text) > 500 else ''}")
    with _quiet():
        signature = inspect.signature(found)
        lines.append(f"Signature:      {name.rpartition('.')[2]}{signature}")
    doc = inspect.getdoc(found) if not isinstance(found, (int, float, str, bytes)) else None
    if doc:
        lines.append(f"Docstring:\n{doc}")
    rank = state.rank()
    lines.append(f"(from replica {rank}'s namespace on its engine)")
    return {"found": True, "text": "\n".join(lines)}


class _Missing:
    pass


_MISSING = _Missing()


def _find(path: str, namespace: dict[str, Any]) -> Any:
    """The object `path` (`a.b.c`) names, by lookups and `getattr` only; `_MISSING` if none."""
    if not _DOTTED.match(path):
        return _MISSING
    first, *rest = path.split(".")
    if first in namespace:
        found = namespace[first]
    elif hasattr(builtins, first):
        found = getattr(builtins, first)
    else:
        return _MISSING
    for part in rest:
        try:
            found = getattr(found, part)
        except Exception:
            return _MISSING
    return found


def _attributes(found: Any) -> list[str]:
    try:
        return list(dir(found))
    except Exception:
        return []


class _quiet:
    """Ignore any error in the block (a repr or signature that fails)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], Exception)
