"""Old import paths that the docs showed, kept working for one release (issue 25's relayout).

`import nbdist` installs an import hook (last on `sys.meta_path`, so real modules always win)
that answers an old module name with the module that replaced it, and warns once per import
with a DeprecationWarning naming the new path. Written by the relayout script; each entry
goes in the release after next.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     module = importlib.import_module(next(iter(OLD_PATHS)))
    >>> module.__name__ == OLD_PATHS[next(iter(OLD_PATHS))]
    True
    >>> any(issubclass(w.category, DeprecationWarning) for w in caught)
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import warnings
from types import ModuleType

from nbdist.errors import MovedModuleWarning

__all__ = ["OLD_PATHS", "install"]

# old module name -> the module that replaced it
OLD_PATHS: dict[str, str] = {
    "nbdist.demo": "nbdist.app.demo",
    "nbdist.placement": "nbdist.core.reduce.placement",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module itself (one module object, under both names)."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old path goes in the "
            "next release).",
            MovedModuleWarning,
            stacklevel=_caller_level(),
        )
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when it was imported."""


def _caller_level() -> int:
    """The `stacklevel` that names the user's import line, past the import machinery (whose
    frames `warnings` skips itself, so they are not counted)."""
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # create_module: stacklevel 1
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:
            frame = frame.f_back
            continue
        if name != __file__:
            return level
        frame, level = frame.f_back, level + 1
    return 2


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = OLD_PATHS.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Put the hook on `sys.meta_path` (once)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())


install()
