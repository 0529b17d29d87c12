"""`LazyModule`: a module imported at its first use (the bottom layer: `_private_api` and
`core` use it).

Example:
    >>> LazyModule("json").dumps([1])
    '[1]'
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

__all__ = ["LazyModule"]

_IMPORTING = threading.RLock()
"""Held while a `LazyModule` imports. torch's import is not safe from two threads at once
(measured: a thread importing torch while another unpickled a tensor failed with `RuntimeError:
generic_type: cannot initialize type "RpcBackendOptions"`), so nbdist's own first uses, from
whichever thread (a stack sampler, a dashboard), import one at a time."""


class LazyModule:
    """A module imported at the first read of one of its attributes (then cached here).

    `torch = LazyModule("torch")` at a module's top costs nothing; `torch.ones(2)` imports
    torch once. Keeps torch off the notebook's start-up path (`Cluster.start()` plans, launches
    and joins without it), while the module's code reads as if torch were imported.

    Example:
        >>> LazyModule("json").dumps([1])
        '[1]'
    """

    def __init__(self, name: str):
        self.__name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_LazyModule__"):  # before `__init__` ran (copy, pickle)
            raise AttributeError(attribute)
        with _IMPORTING:  # one thread imports: two importing torch at once can break it
            value = getattr(importlib.import_module(self.__name), attribute)
        setattr(self, attribute, value)  # later reads find it without calling `__getattr__`
        return value

    def __repr__(self) -> str:
        return f"<lazily imported module {self.__name!r}>"
