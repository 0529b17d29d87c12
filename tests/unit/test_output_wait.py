"""Waiting for engines' printed output after their replies (Note [Output after the reply]).

The parts stand in for ipyparallel's `AsyncResult` (its `ready` and `wait_for_output`): a
reply that is here while its output is still on the way is what a loaded machine produces,
and a real cluster cannot be made to delay only its output relay on demand.
"""

from __future__ import annotations

import threading
import time

from nbdist.cluster.output import say_late_output, wait_for_outputs
from nbdist.cluster.status import EngineInfo


class _Part:
    def __init__(self, answered: bool = True):
        self.answered = answered
        self.output_here = threading.Event()

    def ready(self) -> bool:
        return self.answered

    def wait_for_output(self, timeout: float) -> bool:
        return self.output_here.wait(timeout)


def _engines(count: int) -> list[EngineInfo]:
    return [
        EngineInfo(id=rank, rank=rank, host="127.0.0.1", pid=0, device="cpu:0")
        for rank in range(count)
    ]


def test_output_arriving_seconds_after_the_reply_is_waited_for():
    late_part, on_time = _Part(), _Part()
    on_time.output_here.set()
    timer = threading.Timer(1.5, late_part.output_here.set)  # later than the old 1 s wait
    timer.start()
    try:
        assert wait_for_outputs([late_part, on_time], _engines(2)) == []
        assert late_part.output_here.is_set()
    finally:
        timer.cancel()


def test_output_that_never_completes_is_named_after_one_shared_deadline(capsys):
    parts = [_Part(), _Part(), _Part(answered=False)]
    started = time.monotonic()
    late = wait_for_outputs(parts, _engines(3), timeout_s=0.3)
    assert late == [0, 1]  # replica 2 never answered: its output is not waited for
    assert time.monotonic() - started < 2.0  # one deadline for all, not 0.3 s per engine
    say_late_output(late)
    said = capsys.readouterr().err
    assert "replica(s) [0, 1]" in said and "may be missing" in said


def test_nothing_is_said_when_every_output_arrived(capsys):
    say_late_output([])
    assert capsys.readouterr().err == ""
