"""What a `RemoteError` shows (Note [The cause first] in nbdist/cluster/errors.py), for failures
as engines report them: the causes first with their own frames, one line per replica released
because of them, every frame kept in `details`. (tests/jupyter/test_cause_first.py checks the
same with real engines and a real kernel.)"""

from __future__ import annotations

from nbdist.cluster.errors import SEE_DETAILS, RemoteError, RemoteFailure

FULL = (
    "Traceback (most recent call last):\n"
    '  File "/site-packages/nbdist/collectives/torch_dist.py", line 308, in _collective\n'
    "    return launch(False)\n"
    "RuntimeError: Connection closed by peer [127.0.0.1]:1234. GLHF!\n"
)
SHORT = "Traceback (most recent call last):\n  Cell In[6], line 3, in <module>\n    x = 1 / 0\n"


def _failure(replica, ename, evalue, *, short=SHORT, secondary=False, collective=""):
    full = FULL if secondary else f"{SHORT}{ename}: {evalue}\n"
    return RemoteFailure(
        replica, replica, "host", 100 + replica, ename, evalue, full, secondary, short,
        collective,
    )  # fmt: skip


def test_a_cause_and_a_released_replica():
    error = RemoteError(
        "a %%distribute cell",
        [
            _failure(
                0,
                "WorkerLostError",
                "all_reduce:SUM on rank 0 of 2 was abandoned",
                short="",
                secondary=True,
                collective="all_reduce:SUM #12",
            ),
            _failure(1, "ZeroDivisionError", "division by zero"),
        ],
        2,
        ["The process group was formed again; the cluster is usable."],
    )
    assert error._render_traceback_() == [
        "RemoteError: 1 of 2 replica(s) failed in a %%distribute cell: replica(s) [1] raised "
        "ZeroDivisionError.",
        "Traceback (most recent call last):",
        "  Cell In[6], line 3, in <module>",
        "    x = 1 / 0",
        "[replica 1] ZeroDivisionError: division by zero",
        "replica 0: released from all_reduce:SUM #12 because replica 1 failed",
        "The process group was formed again; the cluster is usable.",
        SEE_DETAILS,
    ]
    assert error.first.replica == 1 and error.replicas == (0, 1)
    assert "GLHF" not in str(error) and "GLHF" in error.details
    assert "torch_dist.py" in error.details and "--- replica 1 (engine 1" in error.details


def test_distinct_causes_each_once_and_a_death():
    error = RemoteError(
        "strategy.run(step)",
        [
            _failure(0, "KeyError", "'a'"),
            _failure(1, "EngineError", "the engine died", short=None),
            _failure(2, "WorkerLostError", "x", short="", secondary=True),
            _failure(3, "KeyError", "'a'"),
        ],
        4,
    )
    shown = error._render_traceback_()
    assert shown[0] == (
        "RemoteError: 3 of 4 replica(s) failed in strategy.run(step): replica(s) [0, 1, 3] "
        "raised EngineError, KeyError."
    )
    assert shown.count("[replicas 0, 3] KeyError: 'a'") == 1
    assert "[replica 1] EngineError: the engine died" in shown  # no short: the full traceback
    released = (
        "replica 2: released from a collective because replicas 0, 3 failed and replica 1 died"
    )
    assert released in shown


def test_a_long_message_is_shown_once():
    message = "Checkpoint 'c.pt' does not fit.\nshapes differ: weight [1, 2] vs [1, 3].\nFix it."
    error = RemoteError(
        "a %%distribute cell",
        [_failure(r, "CheckpointMismatchError", message) for r in (0, 1)],
        2,
    )
    text = "\n".join(error._render_traceback_())
    assert text.count("shapes differ") == 1 and text.count("does not fit") == 1
    assert "[replicas 0, 1] CheckpointMismatchError: Checkpoint 'c.pt' does not fit." in text
