"""The engine-side package (`nbdist.cluster.engine_side`) stays out of user tracebacks, and its
entry points answer with reply dicts, in this process (no engines: the default strategy)."""

from __future__ import annotations

import importlib
import os
import pkgutil

import pytest

import nbdist as nd
from nbdist.cluster import _wire, engine_side
from nbdist.cluster.engine_side import entry_points as calls
from nbdist.cluster.engine_side import state
from nbdist.errors import is_nbdist_file

MODULES = sorted(
    f"{engine_side.__name__}.{info.name}" for info in pkgutil.iter_modules(engine_side.__path__)
)


def test_the_package_holds_one_module_per_job():
    names = {name.rsplit(".", 1)[1] for name in MODULES}
    assert names == {
        "state", "joining", "entry_points", "cell", "health", "failures", "publisher", "guards",
        "progress", "stacks", "resize", "debugger", "completion", "user_code", "dap",
    }


@pytest.mark.parametrize("name", MODULES)
def test_every_engine_side_module_is_hidden_from_user_tracebacks(name):
    module = importlib.import_module(name)
    assert module.__doc__ and "engine" in module.__doc__, f"{name} has no docstring"
    assert _wire.is_internal(module.__file__), f"{name}'s frames would show in remote tracebacks"
    assert is_nbdist_file(module.__file__), f"{name}'s frames would show in local tracebacks"


def _user_step(x):
    return x / 0  # the line the reply points at


@pytest.fixture
def engine_state():
    """The engine state of this process for one test: the default strategy, rank 0."""
    state.attach({})
    state.set_strategy(nd.get_strategy(), 0)
    try:
        yield
    finally:
        state.set_strategy(None, None)
        state.attach(None)


def test_a_failing_call_replies_with_the_users_frames_only(engine_state):
    reply = calls.call(_wire.encode(_wire.Call.of(_user_step, (1,), {})))
    assert reply["ok"] is False and reply["ename"] == "ZeroDivisionError", reply
    assert "_user_step" in reply["traceback"] and "x / 0" in reply["traceback"]
    assert f"{os.sep}engine_side{os.sep}" not in reply["traceback"]
    assert os.path.dirname(nd.__file__) not in reply["traceback"]
    assert reply["where"].startswith("at line ") and "x / 0" in reply["where"]


def test_store_then_fetch_round_trips_a_value(engine_state):
    assert calls.store(_wire.dumps({"answer": 42}))["ok"]
    reply = calls.fetch(_wire.dumps(["answer"]))
    assert reply["ok"] and _wire.loads(reply["value"]) == [42]


def test_an_engine_that_never_joined_says_how_to_fix_it():
    reply = calls.call(_wire.encode(_wire.Call.of(_user_step, (1,), {})))
    assert reply["ok"] is False
    assert "cluster.restart()" in reply["evalue"] or "nd.Cluster" in reply["evalue"], reply


def test_a_caught_interrupt_is_noted_with_where_it_struck_and_where_the_code_is_now():
    """`guards.watched_call` (issue 23, item 7): SIGINT still raises KeyboardInterrupt; once the
    code caught it and runs on, `interrupt_note` says where it struck and where it is now."""
    import os
    import signal

    from nbdist.cluster.engine_side import guards

    assert guards.interrupt_note() is None and not guards.running()
    with guards.watched_call():
        assert guards.running()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            _ = [i for i in range(10**8)]  # interrupted here, by the signal
        except KeyboardInterrupt:
            note = guards.interrupt_note()  # the code runs on after catching it
    assert note is not None and note.startswith("caught the KeyboardInterrupt (raised at ")
    assert "test_cluster_engine_side.py line" in note
    assert "and is still running test_cluster_engine_side.py line" in note
    assert guards.interrupt_note() is None and not guards.running()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_function_ships_its_own_cells_lines_or_none():
    """Note [Shipped source wins] (issue 23, item 9): where every cell has one file name
    (ipykernel's IPYKERNEL_CELL_NAME), the notebook's lines under it may be another cell's;
    they are not shipped, and the engine's lines of that name are replaced (by none), so a
    traceback never shows another cell's line. The function's own lines travel and win."""
    import linecache

    namespace = {"__name__": "__main__"}
    source = "x = 1\ndef step():\n    return missing_name\n"
    exec(compile(source, "<one-name-for-every-cell>", "exec"), namespace)
    step = namespace["step"]
    other = ["y = 2\n", "z = 3\n", "print(y + z)  # another cell\n"]
    linecache.cache["<one-name-for-every-cell>"] = (30, None, other, "<one-name-for-every-cell>")
    shipped = _wire.NamespaceFunction(step)
    assert shipped.source == []
    built = shipped.build({})  # the engine knew the other cell's lines too: replaced by none
    try:
        built()
    except NameError as error:
        text = "".join(_wire.failure(error, "run")["traceback"])
    assert "another cell" not in text and "line 3, in step" in text
    own = source.splitlines(True)
    linecache.cache["<one-name-for-every-cell>"] = (len(source), None, own, "x")
    shipped = _wire.NamespaceFunction(step)
    assert shipped.source == own
    linecache.cache["<one-name-for-every-cell>"] = (30, None, other, "x")  # the engine's
    try:
        shipped.build({})()
    except NameError as error:
        text = "".join(_wire.failure(error, "run")["traceback"])
    assert "return missing_name" in text and "another cell" not in text
    del linecache.cache["<one-name-for-every-cell>"]
