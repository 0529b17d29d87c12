"""How the strategies meet `torch.compile`: what runs between compiled graphs, and the errors.

Note [Compiled steps]: a step given to `strategy.run` may be `torch.compile`d, or may call a
module compiled with `torch.compile(model)`. Dynamo traces the user's code, including the
replica view's `TorchFunctionMode` (so the graph reads the replica's own parameters), but
never nbdist's machinery: the gradient hooks, the end-of-backward callbacks, the optimizer
hooks and the replica-context collectives are marked with `torch.compiler.disable`, so they
run eagerly between graphs (a graph break). Gradients are therefore averaged exactly as in
eager mode: the hooks fire when autograd accumulates each gradient, whether the backward graph
came from Dynamo's AOTAutograd or not. Where a graph break cannot happen (`fullgraph=True`),
the collective is refused with `CompiledCollectiveError`, naming the fix, before any replica
waits on it. docs/compile.md lists every graph break and why.

Example:
    >>> import torch
    >>> @eager_between_graphs
    ... def double(t):
    ...     return t * 2
    >>> double(torch.ones(1))
    tensor([2.])
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from nbdist._private_api import dynamo_frame_hook, skipped_by_dynamo_like
from nbdist.errors import CompiledCollectiveError, ParameterInRunError

__all__ = [
    "CompiledCollectiveError",
    "ParameterInRunError",
    "clear_gradients_eagerly",
    "collective_between_graphs",
    "eager_between_graphs",
    "translate_compile_error",
]

F = TypeVar("F", bound=Callable[..., Any])

# Put in the reason Dynamo prints when it meets a collective it may not break the graph at.
_COLLECTIVE_MARK = "nbdist collective"
_COLLECTIVE_FIX = (
    "compile the step without fullgraph=True (the collective then runs between two graphs), "
    "or call the collective outside the compiled function"
)


def eager_between_graphs(fn: F) -> F:
    """Mark nbdist machinery that Dynamo must not trace: it runs eagerly between graphs.

    Example:
        >>> hook = eager_between_graphs(lambda grad: None)
        >>> callable(hook)
        True
    """
    return _disabled_unless_eager(fn, "nbdist's gradient and optimizer hooks run eagerly")


def collective_between_graphs(fn: F) -> F:
    """Mark a replica-context collective: a graph break in a compiled step, refused where the
    graph may not break (see `translate_compile_error`).

    Example:
        >>> all_reduce = collective_between_graphs(lambda op, value: value)
        >>> all_reduce("sum", 1)
        1
    """
    name = getattr(fn, "__qualname__", "a collective")
    return _disabled_unless_eager(fn, f"{_COLLECTIVE_MARK} {name}: {_COLLECTIVE_FIX}")


def _disabled_unless_eager(fn: F, reason: str) -> F:
    """`torch.compiler.disable(fn, reason=reason)`, without the disable wrapper's cost in
    plain eager code (Note [Eager code skips the disable wrapper]), nor Dynamo's import
    (Note [Dynamo is imported by whoever compiles])."""
    disabled: Callable[..., Any] = fn  # torch.compiler.disable(fn) once Dynamo is imported

    # Note [Eager code skips the disable wrapper]: `disabled` turns Dynamo's frame hook off
    # around the call and back on after: a dozen extra calls each time, paid twice per user
    # collective (`get_replica_context().all_reduce`) and once per parameter per backward (the
    # gradient hooks); in a warm loop 0.36 us against `call`'s 0.15 us, more with cold caches
    # between collectives. With no hook on (nothing runs compiled) there is nothing to turn
    # off, so `call` calls `fn` itself; Dynamo treats `call` exactly as `disabled`
    # (`skipped_by_dynamo_like`).
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if dynamo_frame_hook() is not None:
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)

    def mark() -> None:
        nonlocal disabled
        disabled = torch.compiler.disable(fn, reason=reason)
        skipped_by_dynamo_like(call, disabled)

    _when_dynamo_imported(mark)
    return call  # type: ignore[return-value]


# Note [Dynamo is imported by whoever compiles]: `torch.compiler.disable` imports Dynamo
# (`torch._dynamo`), which costs as much as `import torch` itself (1-2 s on 2 cores). Done when
# this module was imported, every engine of a `Cluster` and every notebook that touched a
# strategy paid it, compiled or not: it doubled `%dist start` (2026-11-24 to -27). Nothing can
# run compiled before Dynamo is imported (`torch.compile` imports it), so the marks wait for
# that: applied at once when Dynamo is already there, else right after its import finishes
# (`_DynamoImportHook`, a `sys.meta_path` finder that wraps Dynamo's loader). A compiled step
# then sees exactly what it saw with eager marking.
_pending_marks: list[Callable[[], None]] = []
_DYNAMO = "torch._dynamo"


def _when_dynamo_imported(mark: Callable[[], None]) -> None:
    """Run `mark` now if Dynamo is imported, else right after it is."""
    module = sys.modules.get(_DYNAMO)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", 0):
        mark()
        return
    _pending_marks.append(mark)
    if not any(isinstance(finder, _DynamoImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DynamoImportHook())


def _run_pending_marks() -> None:
    while _pending_marks:
        _pending_marks.pop(0)()


class _DynamoImportHook(importlib.abc.MetaPathFinder):
    """Finds `torch._dynamo` with the other finders and runs the pending marks once its
    module has executed (then leaves `sys.meta_path`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _MarkingLoader(spec.loader)
        return spec


class _MarkingLoader(importlib.abc.Loader):
    """Dynamo's own loader, then the pending marks (every other attribute is the loader's)."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_pending_marks()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _EagerZeroGrad:
    """`module.zero_grad` that Dynamo calls between graphs instead of tracing.

    Traced, `Module.zero_grad`'s `if p.grad is not None` reads the module's own tensors, not the
    replica's (Note [Replica views] in `_replicas.py`), so on the other replicas of an in-process
    strategy gradients were sometimes left in place and accumulated. Run eagerly, the replica
    view swaps every `p.grad` for the replica's own. An object, not a bound method, so that
    `copy.deepcopy(model)` gives the copy a `zero_grad` of its own.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module

    @eager_between_graphs
    def __call__(self, set_to_none: bool = True) -> None:
        type(self.module).zero_grad(self.module, set_to_none)


def clear_gradients_eagerly(module: torch.nn.Module) -> None:
    """Give `module` (created in an in-process strategy's scope) a `zero_grad` that runs
    between graphs when a compiled step calls it.

    Example:
        >>> layer = torch.nn.Linear(2, 1)
        >>> clear_gradients_eagerly(layer)
        >>> layer.zero_grad()
        >>> layer.weight.grad is None
        True
    """
    if "zero_grad" not in module.__dict__ and type(module).zero_grad is torch.nn.Module.zero_grad:
        module.__dict__["zero_grad"] = _EagerZeroGrad(module)


def translate_compile_error(error: BaseException, replica_id: int) -> BaseException:
    """The error a replica raises: Dynamo's refusal of a collective becomes a
    `CompiledCollectiveError` naming the fix; any other error is returned unchanged.

    Example:
        >>> err = translate_compile_error(ValueError("x"), 0)
        >>> type(err).__name__
        'ValueError'
    """
    text = str(error)
    if not isinstance(error, RuntimeError) or _COLLECTIVE_MARK not in text:
        return error
    where = text.split(_COLLECTIVE_MARK, 1)[1].split(":", 1)[0].strip() or "a collective"
    translated = CompiledCollectiveError(
        f"Replica {replica_id}: {where} was called inside a torch.compile region compiled with "
        f"fullgraph=True, where Dynamo may not break the graph to run it (nbdist's collectives "
        f"and context lookups run between graphs). To fix it, {_COLLECTIVE_FIX}. Gradient "
        f"averaging needs neither: it runs after backward."
    )
    translated.__cause__ = None
    return translated
