"""Import a package's public names on first use (Note [Lazy public API] in `nbdist`).

A package lists `{name: module}` and delegates its module `__getattr__` (PEP 562) here: the
first `nd.MirroredStrategy` imports `nbdist.strategies.mirrored` (and torch) then, never
`import nbdist` itself. One function for `nbdist`, `nbdist.strategies` and `nbdist.cluster`.

Example:
    >>> names = {"OrderedDict": "collections"}
    >>> namespace: dict = {}
    >>> import_lazily("demo", namespace, names, "OrderedDict").__name__
    'OrderedDict'
    >>> "OrderedDict" in namespace   # later uses skip the function
    True
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

__all__ = ["import_lazily"]


def import_lazily(
    package: str,
    namespace: dict[str, Any],
    lazy: Mapping[str, str],
    name: str,
    *,
    submodules: bool = False,
) -> Any:
    """`package.name` from its module in `lazy`, stored in the package's `namespace`.

    A name that maps to a module of the same last name is that module itself (a subpackage:
    `nd.checkpoint`); with `submodules`, any other submodule of `package` is found too
    (`nd.strategies`, as it was when the package imported every layer).

    Raises:
        AttributeError: `package` has no such name (the `__getattr__` protocol: `hasattr`
            and `getattr(..., default)` rely on it).
    """
    module = lazy.get(name)
    if module is None:
        if (
            not submodules
            or name.startswith("_")
            or importlib.util.find_spec(f"{package}.{name}") is None
        ):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = f"{package}.{name}"
    imported = importlib.import_module(module)
    value = imported if module.rpartition(".")[2] == name else getattr(imported, name)
    namespace[name] = value
    return value
