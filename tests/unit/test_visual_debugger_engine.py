"""The engine's half of JupyterLab's visual debugger (`engine_side.dap`), in this process:
line breakpoints with no notebook to attach go on (said on stderr, never a hang), and leave
no breakpoint or trace function behind; a pdb stopped at a line breakpoint answers the
queries the kernel's bridge sends about its frames and variables."""

from __future__ import annotations

import bdb
import linecache
import sys

from nbdist.cluster.engine_side import debugger
from nbdist.cluster.engine_side.dap import Inspector, line_breaks

CODE = "a = 1\nb = a + 1\nc = b * 3\n"


def _cached(filename: str) -> None:
    linecache.cache[filename] = (len(CODE), None, CODE.splitlines(True), filename)


def test_line_breaks_without_a_notebook_go_on(capsys):
    filename = "<distribute-cell-unit-1>"
    _cached(filename)
    namespace: dict = {}
    previous = sys.gettrace()
    try:
        with line_breaks(filename, [2, 3]):
            exec(compile(CODE, filename, "exec"), namespace)
    finally:
        sys.settrace(previous)
    assert namespace["c"] == 6
    err = capsys.readouterr().err
    assert err.count("no notebook debugger attached") == 1, err  # once: then no breakpoints
    assert not bdb.Breakpoint.bplist
    assert debugger._last["session"] is None


def test_inspector_answers_about_a_stopped_frame():
    filename = "<distribute-cell-unit-2>"
    _cached(filename)
    namespace: dict = {"torch_like": [1, 2, 3]}
    exec(compile(CODE, filename, "exec"), namespace)

    def inner(value):
        local = value * 2
        return sys._getframe(), local

    frame, _ = inner(21)
    session = debugger.NotebookPdb(debugger._LazyChannel("unit"))
    session.reset()
    session.setup(frame, None)
    inspector = Inspector(session)
    stack = inspector.answer({"q": "stack"})
    assert stack[0]["name"] == "inner" and stack[0]["index"] == session.curindex
    scopes = inspector.answer({"q": "scopes", "frame": stack[0]["index"]})
    assert [s["name"] for s in scopes] == ["Locals", "Globals"]
    local = {v["name"]: v for v in inspector.answer({"q": "variables", "ref": scopes[0]["ref"]})}
    assert local["value"]["value"] == "21" and local["local"]["value"] == "42"
    assert local["value"]["ref"] == 0  # an int has no children
    assert (
        inspector.answer({"q": "evaluate", "frame": stack[0]["index"], "expression": "local + 1"})[
            "value"
        ]
        == "43"
    )
    inspector.reset()
    stale = inspector.answer({"q": "variables", "ref": scopes[0]["ref"]})
    assert "the replica has moved on" in stale["error"]
    assert "unknown query" in inspector.answer({"q": "nonsense"})["error"]
