"""Every error nbdist raises on purpose is an `NbdistError` (and a builtin).

A static check of the whole package: `raise ValueError(...)` and friends (any builtin exception,
by name) are refused everywhere in nbdist/; the classes in `nbdist.errors` (and the other
error modules) are raised instead, each naming the problem and the fix. What stays a bare
builtin is listed in `ALLOWED`, one entry per function, each with the reason: Python's
protocols (`__getattr__` must raise `AttributeError`, an iterator's end is `StopIteration`,
a `json` `default=` hook raises `TypeError`), Ctrl-C handlers (`KeyboardInterrupt`, as Python
raises it), abstract methods, and the test helpers' own assertions and waits.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import nbdist

ROOT = Path(nbdist.__file__).parent
BUILTINS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
_ABSTRACT = "an abstract method: every subclass overrides it; reaching it is a bug in nbdist"
_GETATTR = "the __getattr__ protocol: hasattr/getattr(default) rely on AttributeError"
_CTRL_C = "Ctrl-C handling: re-raises the user's interrupt as Python does, a KeyboardInterrupt"
_TEST_HELPER = "nbdist.testing, for nbdist's own tests: a failed check or wait of a test"
# (file, function, builtin) -> why it stays a builtin.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("_private_api.py", "__getattr__", "AttributeError"): _GETATTR,
    ("_lazy_module.py", "__getattr__", "AttributeError"): _GETATTR,
    ("input/dataset.py", "__getattr__", "AttributeError"): _GETATTR,
    ("core/values.py", "__getattr__", "AttributeError"): _GETATTR,
    ("telemetry/__init__.py", "__getattr__", "AttributeError"): _GETATTR,
    ("core/lazy.py", "import_lazily", "AttributeError"): _GETATTR,
    ("widgets/_data.py", "__getitem__", "KeyError"): (
        "the mapping protocol: `board.data['metrics']` (kept for old notebooks) raises KeyError "
        "for a name it does not have, as a dict does"
    ),
    ("input/iterator.py", "get_next", "StopIteration"): (
        "the iterator protocol's end of data: __next__ returns get_next(), and for-loops and "
        "next(it, default) stop on StopIteration"
    ),
    ("cluster/launch/ssh_launcher.py", "wait_one", "TimeoutError"): (
        "ipyparallel's launcher protocol: its wait thread and join() catch TimeoutError from "
        "wait_one (still running), as from its own wait_one; never reaches a user"
    ),
    ("cluster/launch/ssh_launcher.py", "wait_one", "RuntimeError"): (
        "ipyparallel's launcher protocol: an unreadable answer from the host, raised as "
        "ipyparallel's own wait_one raises it (its wait thread ends on it)"
    ),
    ("app/interrupts.py", "_note_and_raise", "KeyboardInterrupt"): _CTRL_C,
    ("app/interrupts.py", "raise_if_interrupted", "KeyboardInterrupt"): _CTRL_C,
    ("cluster/engine_side/guards.py", "_on_sigint", "KeyboardInterrupt"): _CTRL_C,
    ("cluster/sigint.py", "interrupts_deferred", "KeyboardInterrupt"): _CTRL_C,
    ("core/reduce/cross_device.py", "_reduce_tensors", "NotImplementedError"): _ABSTRACT,
    ("strategies/base.py", "_call_for_each_replica", "NotImplementedError"): _ABSTRACT,
    ("strategies/base.py", "_replica_all_reduce", "NotImplementedError"): _ABSTRACT,
    ("strategies/base.py", "_replica_all_gather", "NotImplementedError"): _ABSTRACT,
    ("strategies/base.py", "_replica_merge_call", "NotImplementedError"): _ABSTRACT,
    ("strategies/base.py", "_create_variable", "NotImplementedError"): _ABSTRACT,
    ("strategies/parameter_server/channels.py", "call", "NotImplementedError"): _ABSTRACT,
    ("strategies/parameter_server/partitioners.py", "__call__", "NotImplementedError"): _ABSTRACT,
    ("testing/results.py", "_jsonable", "TypeError"): (
        "json.dumps's default= hook: json expects TypeError for a value it cannot encode"
    ),
    ("testing/leftovers.py", "no_leftover_processes", "AssertionError"): _TEST_HELPER,
    ("testing/processes.py", "assert_all_ok", "AssertionError"): _TEST_HELPER,
    ("testing/ports.py", "wait_for_listener", "TimeoutError"): _TEST_HELPER,
    ("testing/jupyterlab.py", "start", "RuntimeError"): _TEST_HELPER,
    ("testing/jupyterlab.py", "start", "TimeoutError"): _TEST_HELPER,
    ("testing/kernels.py", "find_cell", "KeyError"): _TEST_HELPER,
}


def _builtin_raises(source: str) -> list[tuple[int, str, str]]:
    """`(line, enclosing function, builtin)` for each `raise Builtin` / `raise Builtin(...)`."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(target, ast.Name) and target.id in BUILTINS:
                    found.append((child.lineno, function, target.id))
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def _all_builtin_raises() -> dict[tuple[str, str, str], list[int]]:
    sites: dict[tuple[str, str, str], list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for line, function, name in _builtin_raises(path.read_text()):
            sites.setdefault((relative, function, name), []).append(line)
    return sites


def test_nbdist_raises_only_nbdist_errors():
    found = [
        f"{file}:{line} in {function}(): raise {name}"
        for (file, function, name), lines in _all_builtin_raises().items()
        if (file, function, name) not in ALLOWED
        for line in lines
    ]
    assert not found, (
        "raise an nbdist error class (nbdist/errors.py, a subclass of NbdistError, with the "
        "builtin as a second base) that names the fix, instead of a bare builtin; or, for a "
        "protocol method, add it to ALLOWED with the reason:\n" + "\n".join(found)
    )


def test_every_allowed_entry_is_still_raised_and_has_a_reason():
    sites = _all_builtin_raises()
    stale = [entry for entry in ALLOWED if entry not in sites]
    assert not stale, f"no longer raised there; remove from ALLOWED: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_check_finds_a_bare_builtin():
    source = "def f():\n    raise ValueError('x')\n\ndef g():\n    raise KeyboardInterrupt\n"
    assert _builtin_raises(source) == [(2, "f", "ValueError"), (5, "g", "KeyboardInterrupt")]


def test_the_generic_error_classes_are_builtins_too():
    from nbdist.errors import ArgumentTypeError, ContextError, InvalidArgumentError, NbdistError

    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ContextError, RuntimeError)
    assert all(issubclass(c, NbdistError) for c in (InvalidArgumentError, ArgumentTypeError))


def test_run_steps_end_of_data_is_input_exhausted_and_still_a_stop_iteration():
    from nbdist.input.errors import InputExhaustedError, StepsExhaustedError

    assert issubclass(StepsExhaustedError, InputExhaustedError)
    assert issubclass(StepsExhaustedError, StopIteration)


def _warning_classes() -> set[str]:
    import nbdist.input.batches  # noqa: F401  (defines EmptyReplicaBatchWarning)
    from nbdist.errors import NbdistWarning

    names, pending = set(), [NbdistWarning]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return names


def test_every_warning_nbdist_gives_is_an_nbdist_warning():
    allowed = _warning_classes()
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if not (isinstance(func, ast.Attribute) and func.attr == "warn"):
                continue
            if not (isinstance(func.value, ast.Name) and func.value.id == "warnings"):
                continue
            category = node.args[1] if len(node.args) > 1 else None
            for keyword in node.keywords:
                if keyword.arg == "category":
                    category = keyword.value
            name = category.id if isinstance(category, ast.Name) else None
            if name not in allowed:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append(f"{where} warns {name or 'UserWarning'}")
    assert not found, "warn with an NbdistWarning subclass (nbdist/errors.py):\n" + "\n".join(found)


def test_an_unexpected_nbdist_warning_fails_a_test():
    """pyproject.toml's filterwarnings turns nbdist's warnings into errors in its tests."""
    import warnings

    from nbdist.errors import CheckpointStateWarning
    from nbdist.input.batches import EmptyReplicaBatchWarning

    for category in (EmptyReplicaBatchWarning, CheckpointStateWarning):
        with pytest.raises(category):
            warnings.warn("not expected", category, stacklevel=1)
