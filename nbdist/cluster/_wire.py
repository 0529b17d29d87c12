"""What crosses between the notebook and the engines: calls, arguments, results, failures.

Both sides import this module. The notebook pickles a call once with cloudpickle (`encode`)
and ipyparallel carries the bytes; the engine unpickles them, runs the call and sends back
either `{"ok": True, "value": <pickled result>}` or a failure dict (`failure`), never a raised
exception, so the client can say which replica failed and why.

Note [Names resolve on the engines]: a function defined in `__main__` (a notebook cell, or one
wrapped by `ipyparallel.interactive`) travels as its code, defaults and closure only
(`NamespaceFunction`) and is rebuilt on the engine with the engine's namespace as its globals,
so `model` in `def step(x): return model(x)` is the engine's `model` (ipyparallel's
`interactive` behaviour). Every other callable is pickled by cloudpickle: by reference to its
module when that module is importable (it must be importable on the engines too), by value
otherwise (lambdas and closures outside `__main__`).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import pickle
import traceback as traceback_module
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Call",
    "NamespaceFunction",
    "cut_from_tracebacks",
    "dumps",
    "encode",
    "failure",
    "is_internal",
    "is_namespace_function",
    "loads",
    "portable",
]

_SOURCE_LIMIT = 200_000  # characters of a cell's source shipped for tracebacks
_NBDIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dumps(value: Any) -> bytes:
    """cloudpickle `value` (highest protocol)."""
    import cloudpickle

    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """Unpickle what `dumps` made."""
    return pickle.loads(data)


class _EmptyCell:
    """Marks a closure cell that had no value yet (a class, so identity survives pickling)."""


def is_namespace_function(fn: Any) -> bool:
    """True for a plain function defined in `__main__` (see Note [Names resolve on the engines])."""
    return isinstance(fn, types.FunctionType) and fn.__module__ == "__main__"


class NamespaceFunction:
    """A `__main__` function, rebuilt on an engine with that engine's namespace as globals.

    Example:
        >>> def f(x):
        ...     return x + offset
        >>> g = NamespaceFunction(f).build({"offset": 10})
        >>> g(1)
        11
    """

    # Note [Shipped source wins]: a notebook cell's "file" exists only in the notebook's
    # linecache; the engine may know the same name with other lines (an earlier version of
    # the cell, a cell of its own under that name, a file of that path on its host), and
    # where every cell has one name (ipykernel's IPYKERNEL_CELL_NAME) even the notebook's
    # lines may be another cell's. Lines that do not define the function there are not
    # shipped (`_defines`), and the lines shipped replace the engine's, so a traceback on the
    # engine shows the function's own line, or none, never another cell's.

    def __init__(self, fn: types.FunctionType):
        self.code = fn.__code__
        self.name = fn.__name__
        self.qualname = fn.__qualname__
        self.doc = fn.__doc__
        self.defaults = fn.__defaults__
        self.kwdefaults = fn.__kwdefaults__
        self.closure = (
            None if fn.__closure__ is None else tuple(_cell_value(c) for c in fn.__closure__)
        )
        filename = self.code.co_filename
        lines = linecache.getlines(filename)
        if not _defines(lines, self.code):
            lines = []  # another cell's lines under this name (IPYKERNEL_CELL_NAME): show none
        self.source = lines if sum(map(len, lines)) <= _SOURCE_LIMIT else None

    def build(self, namespace: dict[str, Any]) -> types.FunctionType:
        """The function, with `namespace` as its globals."""
        filename = self.code.co_filename
        if self.source and linecache.getlines(filename) != self.source:
            # So that the engine's traceback shows the notebook's lines, never the lines of
            # whatever the engine knows under that name (Note [Shipped source wins]).
            size = sum(map(len, self.source))
            linecache.cache[filename] = (size, None, list(self.source), filename)
        elif self.source is not None and not self.source:
            # The notebook had no lines of this function: show none rather than another's.
            linecache.cache[filename] = (0, None, [], filename)
        closure = None
        if self.closure is not None:
            closure = tuple(
                types.CellType() if value is _EmptyCell else types.CellType(value)
                for value in self.closure
            )
        fn = types.FunctionType(self.code, namespace, self.name, self.defaults, closure)
        fn.__kwdefaults__ = self.kwdefaults
        fn.__qualname__ = self.qualname
        fn.__doc__ = self.doc
        return fn

    def __repr__(self) -> str:
        return f"<function {self.qualname} (resolved on the engine)>"


def _defines(lines: Sequence[str], code: types.CodeType) -> bool:
    """True when `lines` hold the definition of `code` where it says it starts (a `def` of its
    name, or a `lambda`, within the first lines of the definition, decorators included).

    Example:
        >>> def f():
        ...     return 1
        >>> code = f.__code__.replace(co_firstlineno=2)
        >>> _defines(["x = 1\\n", "def f():\\n", "    return 1\\n"], code)
        True
        >>> _defines(["x = 1\\n", "y = 2\\n", "z = 3\\n"], code)
        False
    """
    first = code.co_firstlineno
    if not 0 < first <= len(lines):
        return False
    window = lines[first - 1 : first + 19]
    if code.co_name == "<lambda>":
        return "lambda" in window[0]
    return any(
        line.lstrip().startswith((f"def {code.co_name}", f"async def {code.co_name}"))
        for line in window
    )


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EmptyCell


@dataclasses.dataclass
class Call:
    """One function call to make on an engine: `fn(*args, **kwargs)`."""

    fn: Any
    args: tuple = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Call:
        shipped = NamespaceFunction(fn) if is_namespace_function(fn) else fn
        return cls(shipped, tuple(args), dict(kwargs))

    def function(self, namespace: dict[str, Any]) -> Callable[..., Any]:
        if isinstance(self.fn, NamespaceFunction):
            return self.fn.build(namespace)
        return self.fn


def encode(value: Any, parts: Sequence[tuple[str, Any]] = ()) -> bytes:
    """Pickle `value`; on failure raise `SerializationError` naming the part that failed.

    Args:
        value: What to pickle.
        parts: `(label, object)` pairs making up `value`, tried one by one after a failure to
            name the culprit (e.g. `("args[1]", lock)`).
    """
    from nbdist.cluster.errors import SerializationError

    try:
        return dumps(value)
    except Exception as error:
        culprit, cause = None, error
        for label, part in parts:
            try:
                dumps(part)
            except Exception as part_error:
                culprit, cause = (label, part), part_error
                break
        if culprit is None:
            what = "The call"
        else:
            label, part = culprit
            what = f"{label} (a {type(part).__module__}.{type(part).__qualname__})"
        raise SerializationError(
            f"{what} cannot be sent to the engines: {type(cause).__name__}: {cause}. Send "
            "plain data (tensors, numbers, strings, lists, dicts), or create the object on the "
            "engines and pass nd.remote('its_name') in its place."
        ) from cause


def portable(value: Any) -> Any:
    """`value` with every tensor detached and moved to the CPU (so any client can unpickle it).

    A sharded parameter (a `DTensor` of `FullyShardedStrategy`) becomes this engine's local
    shard: a `DTensor` needs its process group, which the notebook does not have, and gathering
    it here would be a collective no caller asked for (`strategy.gather` on the engines gives
    the whole tensor; docs/tf-differences.md).
    """
    import torch

    from nbdist._private_api import pytree

    def leaf(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            local = getattr(item, "to_local", None)
            item = (local() if local is not None else item).detach()
            return item if item.device.type == "cpu" else item.cpu()
        return item

    return pytree.tree_map(leaf, value)


_SECONDARY = ("WorkerLostError", "ReplicaReleasedError", "CollectiveTimeoutError")


def failure(error: BaseException, stage: str) -> dict[str, Any]:
    """A failure reply: the exception's name, message and traceback (nbdist's frames cut)."""
    tb = error.__traceback__
    while tb is not None and cut_from_tracebacks(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None:  # raised by nbdist itself (e.g. a missing nd.remote name): the message says it
        text = "".join(traceback_module.format_exception_only(type(error), error))
    else:
        shown = traceback_module.TracebackException(type(error), error, tb)
        if _raised_on_purpose(error):  # the user's frames and the message say it all
            frames = [f for f in shown.stack if not cut_from_tracebacks(f.filename)]
            shown.stack = traceback_module.StackSummary.from_list(frames)
        text = "".join(shown.format())
    return {
        "ok": False,
        "stage": stage,
        "ename": type(error).__name__,
        "evalue": str(error),
        "traceback": text,
        "secondary": type(error).__name__ in _SECONDARY,
        "name": getattr(error, "name", None) if isinstance(error, NameError) else None,
    }


def _raised_on_purpose(error: BaseException) -> bool:
    """True for an nbdist error (its frames inside nbdist are left out of the traceback)."""
    from nbdist.errors import NbdistError

    return isinstance(error, NbdistError)


_PLUMBING = (f"{os.sep}ipyparallel{os.sep}", f"{os.sep}torch{os.sep}utils{os.sep}_pytree.py")


def is_internal(filename: str) -> bool:
    """True for frames of nbdist and of the machinery that calls the user's function."""
    return _internal(filename)


def cut_from_tracebacks(filename: str) -> bool:
    """True for the frames a failure's traceback leaves out: `is_internal`'s, but nbdist's
    own frames are kept when `NBDIST_SHOW_INTERNAL_FRAMES=1` (debugging nbdist itself)."""
    from nbdist.errors import show_internal_frames

    if show_internal_frames():
        return any(part in os.path.abspath(filename) for part in _PLUMBING)
    return _internal(filename)


def _internal(filename: str) -> bool:
    """Frames of nbdist and of the machinery calling the user's function, cut from tracebacks."""
    path = os.path.abspath(filename)
    return path.startswith(_NBDIST_DIR + os.sep) or any(part in path for part in _PLUMBING)
