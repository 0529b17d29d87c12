"""`NBDIST_SHOW_INTERNAL_FRAMES=1` keeps nbdist's own frames in the tracebacks users see (for
debugging nbdist itself): an `NbdistError` in a notebook, a failure an engine reports, and a
`RemoteError`. Without it, those frames are left out (docs/troubleshooting.md)."""

from __future__ import annotations

import pytest

import nbdist as nd
from nbdist.cluster import _wire
from nbdist.cluster.errors import RemoteError, RemoteFailure
from nbdist.errors import SHOW_INTERNAL_FRAMES, UnsupportedOptionError, user_traceback

NBDIST_FRAME = "/nbdist/strategies/"


def _raised_inside_nbdist() -> UnsupportedOptionError:
    with pytest.raises(UnsupportedOptionError) as caught:
        nd.OneDeviceStrategy("cpu").run(lambda: 1, options={"xla": True})
    return caught.value


@pytest.mark.parametrize("value, shown", [(None, False), ("0", False), ("1", True)])
def test_a_notebook_traceback_keeps_nbdists_frames_only_when_asked(monkeypatch, value, shown):
    if value is None:
        monkeypatch.delenv(SHOW_INTERNAL_FRAMES, raising=False)
    else:
        monkeypatch.setenv(SHOW_INTERNAL_FRAMES, value)
    lines = "\n".join(user_traceback(_raised_inside_nbdist()))
    assert (NBDIST_FRAME in lines) is shown, lines
    assert "test_show_internal_frames.py" in lines  # the user's own frame, always


def test_an_engines_failure_reply_keeps_nbdists_frames_only_when_asked(monkeypatch):
    error = _raised_inside_nbdist()
    monkeypatch.delenv(SHOW_INTERNAL_FRAMES, raising=False)
    assert NBDIST_FRAME not in _wire.failure(error, "call")["traceback"]
    monkeypatch.setenv(SHOW_INTERNAL_FRAMES, "1")
    assert NBDIST_FRAME in _wire.failure(error, "call")["traceback"]


def test_a_remote_error_shows_the_whole_traceback_when_asked(monkeypatch):
    full = (
        "Traceback (most recent call last):\n"
        '  File "/site-packages/nbdist/collectives/torch_dist.py", line 308, in _collective\n'
        "    return launch(False)\n"
        "ValueError: boom\n"
    )
    short = "Traceback (most recent call last):\n  Cell In[6], line 3, in <module>\n    f()\n"
    failure = RemoteFailure(1, 1, "host", 101, "ValueError", "boom", full, False, short)
    error = RemoteError("a %%distribute cell", [failure], 2)
    monkeypatch.delenv(SHOW_INTERNAL_FRAMES, raising=False)
    assert "torch_dist.py" not in "\n".join(error._render_traceback_())
    monkeypatch.setenv(SHOW_INTERNAL_FRAMES, "1")
    shown = "\n".join(error._render_traceback_())
    assert "torch_dist.py" in shown and "[replica 1] ValueError: boom" in shown
