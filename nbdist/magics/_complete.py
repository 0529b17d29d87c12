"""Tab and Shift+Tab in a `%%distribute` cell answer from replica 0's namespace.

Code in a `%%distribute` cell (every cell, with `%dist auto on`) runs on the engines, so the
names it completes live there, not in the notebook's kernel. `install(shell, magics)` adds:

- an IPython completion matcher (a context matcher, IPython's public API for adding
  completions): in such a cell, it asks replica 0's engine for the names and attributes that
  complete the token at the cursor, and merges them with IPython's own;
- a wrapper of the kernel's `do_inspect` (Shift+Tab, `inspect_request`): in such a cell, the
  inspection of the name at the cursor comes from replica 0's namespace when the notebook's
  kernel does not know the name.

Both ask the engine's stack server (`engine_side.completion`), which answers from its own
thread, also while a cell runs, within `TIMEOUT_S`; an engine that does not answer in time
adds nothing, so the notebook never waits longer than that.

Example (in a notebook)::

    %%distribute
    engine_only_model.we<Tab>      # -> engine_only_model.weight
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["TIMEOUT_S", "engine_answer", "install", "uninstall"]

TIMEOUT_S = 1.0
"""Seconds a completion or inspection waits for replica 0's engine."""
_installed: dict[int, tuple[Any, Any]] = {}


def engine_answer(magics: Any, what: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """Replica 0's engine's answer to `what` (`"complete"` or `"inspect"`), or None when no
    cluster runs or it did not answer within `TIMEOUT_S`."""
    cluster = getattr(magics, "cluster", None)
    if cluster is None or not cluster.running or not cluster.engines:
        return None
    from nbdist.cluster.stacks import ask_engines

    first = min(cluster.engines, key=lambda info: info.rank)
    answers = ask_engines([first], f"{what} {json.dumps(request)}", TIMEOUT_S)
    reply, _ = answers.get(first.rank, (None, ""))
    return reply


def _runs_on_engines(magics: Any, text: str) -> bool:
    """True for a `%%distribute` cell, or any cell with `%dist auto on`."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return first.lstrip().startswith("%%distribute") or bool(getattr(magics, "auto", False))


def install(shell: Any, magics: Any) -> None:
    """Add the matcher and the inspection wrapper to `shell` (and its kernel) once."""
    if id(shell) in _installed or getattr(shell, "Completer", None) is None:
        return
    from IPython.core.completer import SimpleCompletion, context_matcher

    @context_matcher(identifier="nbdist.engine_names")
    def engine_names(context: Any) -> dict[str, Any]:
        """Names from replica 0's namespace, in a cell that runs on the engines."""
        none: dict[str, Any] = {"completions": [], "suppress": False}
        if not _runs_on_engines(magics, context.full_text):
            return none
        token = context.token
        if not token or token.startswith("%"):
            return none
        reply = engine_answer(magics, "complete", {"token": token})
        if not reply:
            return none
        completions = [SimpleCompletion(text, type="engine") for text in reply.get("matches", [])]
        return {"completions": completions, "suppress": False}

    shell.Completer.custom_matchers.append(engine_names)
    kernel = getattr(shell, "kernel", None)
    original = getattr(kernel, "do_inspect", None)
    if original is not None:

        def do_inspect(code: str, cursor_pos: int, detail_level: int = 0, omit_sections=()):
            reply = original(code, cursor_pos, detail_level, omit_sections)
            if getattr(reply, "get", None) is None or reply.get("found"):
                return reply
            if not _runs_on_engines(magics, code):
                return reply
            from IPython.utils.tokenutil import token_at_cursor

            answer = engine_answer(magics, "inspect", {"name": token_at_cursor(code, cursor_pos)})
            if not answer or not answer.get("found"):
                return reply
            return {"status": "ok", "found": True, "data": {"text/plain": answer["text"]},
                    "metadata": {}}  # fmt: skip

        kernel.do_inspect = do_inspect
    _installed[id(shell)] = (engine_names, original)


def uninstall(shell: Any) -> None:
    """Remove what `install` added to `shell`."""
    matcher, original = _installed.pop(id(shell), (None, None))
    if matcher is not None and matcher in shell.Completer.custom_matchers:
        shell.Completer.custom_matchers.remove(matcher)
    kernel = getattr(shell, "kernel", None)
    if original is not None and kernel is not None:
        kernel.do_inspect = original
