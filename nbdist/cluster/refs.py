"""`nd.remote("name")`: a reference to an object that lives in every engine's namespace.

`RemoteRef` is created in the notebook (`nd.remote("model")`, or a name given to `run_steps`)
and resolved on each engine (`RemoteRef.resolve`) by the engine-side entry points
(`engine_side.calls`), which import it from here: a module of its own, so the engine side
never imports the notebook's `EngineStrategy` (`remote`), and `remote` imports the entry
points without a cycle.

Example:
    >>> remote("model.fc.weight")
    nd.remote('model.fc.weight')
"""

from __future__ import annotations

import builtins
import dataclasses
import re
from typing import Any

from nbdist.cluster.errors import RemoteNameError
from nbdist.errors import InvalidArgumentError

__all__ = ["RemoteRef", "remote"]

_LISTED_NAMES = 12


@dataclasses.dataclass(frozen=True)
class RemoteRef:
    """Stands for a variable in each engine's namespace (made by `nd.remote`).

    Attributes:
        name: The variable's name, or a dotted path into it (`"model.fc"`).
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _PATH.fullmatch(self.name):
            raise InvalidArgumentError(
                "nd.remote needs a variable name or a path into it, such as 'model', "
                "'model.fc', 'model.0.weight' or 'model[0].weight' (attributes, integer "
                f"indices, ['key'] entries), got {self.name!r}."
            )

    def steps(self) -> list[tuple[str, Any]]:
        """The path after the first name: `("attr", name)`, `("item", index or key)`, or
        `("attr_or_item", digits)` for `.0` (a submodule named "0", else index 0).

        Example:
            >>> RemoteRef("model.0[1]['w']").steps()
            [('attr_or_item', '0'), ('item', 1), ('item', 'w')]
        """
        out: list[tuple[str, Any]] = []
        for match in _STEP.finditer(self.name, _FIRST.match(self.name).end()):
            attr, digits, index, key1, key2 = match.groups()
            if attr is not None:
                out.append(("attr", attr))
            elif digits is not None:
                out.append(("attr_or_item", digits))
            elif index is not None:
                out.append(("item", int(index)))
            else:
                out.append(("item", key1 if key1 is not None else key2))
        return out

    def resolve(self, namespace: dict[str, Any], replica: int | None = None) -> Any:
        """The object this reference names in `namespace` (on an engine).

        Raises:
            RemoteNameError: (a `NameError`) the name, or a step on its path, is missing.
        """
        first = _FIRST.match(self.name).group(0)
        where = f"engine of replica {replica}" if replica is not None else "engine"
        if first not in namespace:
            names = sorted(k for k in namespace if not k.startswith("_") and k not in _SHELL)
            listed = ", ".join(names[:_LISTED_NAMES]) + (" …" if len(names) > _LISTED_NAMES else "")
            raise RemoteNameError(
                f"{self!r}: the {where} has no variable {first!r}. Create it on the engines "
                "first (in a %%distribute cell, with cluster.push({...}) or inside "
                f"cluster.strategy.run). Variables there: {listed or 'none'}.",
                name=first,
            )
        value, path = namespace[first], first
        for kind, step in self.steps():
            shown = f"{path}.{step}" if kind != "item" else f"{path}[{step!r}]"
            found, value = _step(value, kind, step)
            if not found:
                raise RemoteNameError(
                    f"{self!r}: on the {where}, {path} (a {type(found.owner).__name__}) has "
                    f"no {found.what}, so {shown} does not exist.",
                    name=str(step),
                )
            path = shown
        return value

    def __repr__(self) -> str:
        return f"nd.remote({self.name!r})"


_FIRST = re.compile(r"[A-Za-z_]\w*")
_STEP = re.compile(r"""\.([A-Za-z_]\w*)|\.(\d+)|\[(-?\d+)\]|\['([^']*)'\]|\["([^"]*)"\]""")
_PATH = re.compile(rf"{_FIRST.pattern}(?:{_STEP.pattern})*")


@dataclasses.dataclass
class _Missing:
    """Why a step of a path found nothing (falsy)."""

    owner: Any
    what: str

    def __bool__(self) -> bool:
        return False


def _step(value: Any, kind: str, step: Any) -> tuple[Any, Any]:
    """`(True, next value)`, or `(_Missing, None)` when `value` has no such attribute/item."""
    if kind in ("attr", "attr_or_item") and hasattr(value, str(step)):
        return True, getattr(value, str(step))
    if kind == "attr":
        return _Missing(value, f"attribute {step!r}"), None
    index = int(step) if kind == "attr_or_item" else step
    try:
        return True, value[index]
    except (IndexError, KeyError, TypeError):
        what = "attribute or item" if kind == "attr_or_item" else "item"
        return _Missing(value, f"{what} {step!r}"), None


_SHELL = frozenset({"In", "Out", "exit", "quit", "get_ipython", *dir(builtins)})


def remote(name: str) -> RemoteRef:
    """A placeholder for the engine-side variable `name`, for `cluster.strategy.run` arguments.

    Each engine replaces it by its own object of that name before calling the function, so
    a model or optimizer that lives on the engines can be passed without leaving them.

    Example:
        >>> remote("model")
        nd.remote('model')
    """
    return RemoteRef(name)
