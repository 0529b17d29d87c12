"""`@nd.on_scale`: the user's own functions to run on every engine after a resize.

`%dist scale` moves the state a strategy tracks (models, optimizers, variables and datasets
made in `scope()`) to the new engines; other Python state on the engines does not move. A
function decorated `@nd.on_scale` re-creates that state: it runs on every engine after each
resize, with a `ScaleEvent` saying what changed (`event.joined` is True on an engine that has
just started). Decorated in a `%%distribute` cell, it is registered on the engines (and copied
to joining ones); decorated in the notebook, it is sent to every engine at each resize.

Example:
    >>> import nbdist as nd
    >>> @nd.on_scale
    ... def rebuild(event):
    ...     print(f"{event.old} -> {event.new} replicas")
    >>> nd.on_scale.registered()[-1] is rebuild
    True
    >>> nd.on_scale.discard(rebuild)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["ScaleEvent", "on_scale"]


@dataclasses.dataclass(frozen=True)
class ScaleEvent:
    """What a resize changed, as an `@nd.on_scale` function sees it on one engine.

    Attributes:
        old: Replicas before.
        new: Replicas after (`num_replicas_in_sync`).
        reason: Why (`"scale 2 → 3"`, `"survivors after replica 1's engine died"`).
        keep: `"global-batch"` or `"replica-batch"`.
        joined: True on an engine that joined in this resize.
        rank: This engine's replica id after the resize.
    """

    old: int
    new: int
    reason: str
    keep: str
    joined: bool
    rank: int


class _Registry:
    """`nd.on_scale`: a decorator keeping functions in registration order (see the module)."""

    def __init__(self) -> None:
        self._functions: list[Callable[[ScaleEvent], Any]] = []

    def __call__(self, fn: Callable[[ScaleEvent], Any]) -> Callable[[ScaleEvent], Any]:
        """Register `fn(event)` to run on every engine after a resize; returns `fn`. A
        function of the same module and name replaces the one registered before (so a
        cell run twice registers it once)."""
        if not callable(fn):
            from nbdist.errors import ArgumentTypeError

            raise ArgumentTypeError(
                f"@nd.on_scale decorates a function taking a ScaleEvent, got {fn!r}; e.g. "
                "@nd.on_scale\\ndef rebuild(event): ..."
            )
        key = _key(fn)
        self._functions = [f for f in self._functions if _key(f) != key]
        self._functions.append(fn)
        return fn

    def registered(self) -> list[Callable[[ScaleEvent], Any]]:
        """The registered functions, oldest first."""
        return list(self._functions)

    def discard(self, fn: Callable[[ScaleEvent], Any]) -> None:
        """Unregister `fn` (nothing happens if it was not registered)."""
        self._functions = [f for f in self._functions if f is not fn]

    def extend(self, functions: list[Callable[[ScaleEvent], Any]]) -> None:
        """Register `functions` (copied from another process), keeping their order."""
        for fn in functions:
            self(fn)

    def __repr__(self) -> str:
        names = [getattr(f, "__qualname__", repr(f)) for f in self._functions]
        return f"<nd.on_scale: {names}>"


def _key(fn: Callable[..., Any]) -> tuple[str, str]:
    return (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn)))


on_scale = _Registry()
"""Decorator: `@nd.on_scale` registers a function to run on every engine after a resize."""
