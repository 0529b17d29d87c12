"""The static view that `%%distribute --output tabs` leaves in a saved notebook (issue 27,
item 4; Note [A static view for the saved notebook] in `nbdist.magics._tabs`)."""

from __future__ import annotations

from nbdist.magics._tabs import ReplicaOutput, static_view


def _replica(rank: int, state: str, *items: tuple[str, object]) -> ReplicaOutput:
    replica = ReplicaOutput(rank)
    replica.state = state
    replica.items = list(items)
    replica.lines = sum(str(v).count("\n") for kind, v in items if kind in ("stdout", "stderr"))
    return replica


def test_identical_replicas_share_a_tab_and_the_view_opens_on_the_failed_one():
    same = ("stdout", "epoch 1\nepoch 2\n")
    view = static_view([
        _replica(0, "done", same),
        _replica(1, "failed", ("stdout", "epoch 1\n"), ("error", "ValueError: <bad> & worse\n")),
        _replica(2, "done", same),
        _replica(3, "done", same),
    ])  # fmt: skip
    page = view["text/html"]
    assert page.count("<label") == 2  # [0, 2, 3] and [1]
    assert "[0, 2, 3] done · 2 lines" in page
    chosen = page.split(" checked>")[1].split("</label>")[0]
    assert "[1] ✗ failed · 1 line" in chosen and page.count(" checked>") == 1
    assert "ValueError: &lt;bad&gt; &amp; worse" in page and "<bad>" not in page
    text = view["text/plain"].splitlines()
    assert "[1] ValueError: <bad> & worse" in text and text.count("[3] epoch 2") == 1


def test_without_a_failure_the_first_tab_is_chosen_and_images_are_inlined():
    view = static_view([
        _replica(0, "done", ("data", {"image/png": "iVBORw0K", "text/plain": "<Figure>"})),
        _replica(1, "done"),
    ])  # fmt: skip
    page = view["text/html"]
    assert "[0] done · 0 lines" in page.split(" checked>")[1].split("</label>")[0]
    assert '<img src="data:image/png;base64,iVBORw0K">' in page
    assert "(no output)" in page  # replica 1 printed nothing: its tab says so
