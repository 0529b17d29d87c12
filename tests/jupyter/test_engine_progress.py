"""`nd.progress` in a `%%distribute` cell (issue 24, item 1), in a terminal-like IPython shell.

The shell here is not a Jupyter kernel, so `tqdm.auto` draws text on stderr, as in
`jupyter console` or IPython in a terminal: one bar for the cell, redrawn while the engines
iterate (replica 0's count), ending at 100 % with the loop's total, and no engine text bar
relayed line by line (`[0] training: …`). The widget case runs in a real kernel:
tests/jupyter/test_engine_output.py.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.cluster

TOTAL = 40
LOOP = (
    "import time\n"
    f"for batch in nd.progress(range({TOTAL}), desc='training'):\n"
    "    time.sleep(0.1)\n"
    "    if batch == 20:\n"
    "        print('half way on replica', rank)\n"
    "print('trained on replica', rank)\n"
)


def _frames(err: str) -> list[str]:
    """The bar's redraws, in order (tqdm separates them with a carriage return)."""
    return [frame.strip() for frame in re.split(r"[\r\n]", err) if "training" in frame]


def _counts(frames: list[str]) -> list[int]:
    return [int(m.group(1)) for f in frames if (m := re.search(rf"(\d+)/{TOTAL}\b", f))]


@pytest.fixture(scope="module")
def shell(dist_shell):
    dist_shell.run_cell_magic("distribute", "", "import os\nrank = int(os.environ['RANK'])")
    return dist_shell


@pytest.mark.parametrize("output", ["all", "first", "none"])
def test_one_text_bar_for_the_cell_reaching_100_percent(shell, capsys, output):
    capsys.readouterr()
    shell.run_cell_magic("distribute", f"--output {output}", LOOP)
    captured = capsys.readouterr()
    frames = _frames(captured.err)
    counts = _counts(frames)
    assert frames, f"no bar drawn; stderr was {captured.err!r}"
    # no relayed engine bar: the bar is the notebook's own, never prefixed by a replica
    assert not re.search(r"\[\d\] training", captured.out + captured.err), captured.err
    assert "100%" in frames[-1] and f"{TOTAL}/{TOTAL}" in frames[-1], frames[-1]
    assert counts == sorted(counts), counts  # one bar (replica 0's), never counting back
    assert any(0 < c < TOTAL for c in counts), f"never redrawn while running: {frames}"
    printed = {r for r in (0, 1) if f"[{r}] trained on replica {r}" in captured.out}
    assert printed == {"all": {0, 1}, "first": {0}, "none": set()}[output], captured.out
    halfway = {r for r in (0, 1) if f"[{r}] half way on replica {r}\n" in captured.out}
    assert halfway == printed, captured.out  # whole lines, also while the bar is drawn


def test_two_loops_give_two_bars_and_a_loop_left_early_stops_short(shell, capsys):
    capsys.readouterr()
    shell.run_cell_magic(
        "distribute",
        "",
        "for epoch in range(2):\n"
        "    for batch in nd.progress(range(5), desc=f'epoch {epoch}'):\n"
        "        pass\n"
        f"for batch in nd.progress(range({TOTAL}), desc='training'):\n"
        "    if batch == 9:\n"
        "        break\n",
    )
    err = capsys.readouterr().err
    lines = [line.rsplit("\r", 1)[-1] for line in err.split("\n") if line.strip()]
    finals = [line for line in lines if "epoch" in line or "training" in line]
    assert len(finals) == 3, err
    assert "epoch 0: 100%" in finals[0] and "5/5" in finals[0]
    assert "epoch 1: 100%" in finals[1] and "5/5" in finals[1]
    assert f"9/{TOTAL}" in finals[2] and "100%" not in finals[2], finals[2]


def test_the_bar_follows_the_first_target_replica(shell, capsys):
    capsys.readouterr()
    shell.run_cell_magic(
        "distribute",
        "--targets 1",
        f"for batch in nd.progress(range({TOTAL}), desc='training'):\n    pass\n",
    )
    frames = _frames(capsys.readouterr().err)
    assert frames and f"{TOTAL}/{TOTAL}" in frames[-1], frames
