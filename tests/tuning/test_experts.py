"""Simulated steps' expert loads come from the recorded steps of the same size."""

from typing import Any

import pytest

from tuning.twin.experts import ExpertDraw, routing


def step(counts: list[list[int]], top_k: int = 2) -> dict[str, Any]:
    return {"experts": {"counts": counts, "top_k": top_k}}


def test_a_recorded_size_replays_its_steps_in_order() -> None:
    a, b = [[4, 0, 2, 0]], [[3, 3, 0, 0]]
    draw = ExpertDraw(routing([step(a), step([[1, 1, 0, 0]]), step(b)]))
    assert [draw.draw(3).tolist() for _ in range(3)] == [a, b, a]
    draw.restart()
    assert draw.draw(3).tolist() == a


def test_an_unseen_size_keeps_the_nearest_steps_concentration() -> None:
    """Recorded steps route nearly everything to experts 0 and 1 in layer 0 and to 6 and 7 in
    layer 1; a larger step than any recorded routes the same way, each token to top_k
    distinct experts."""
    hot = [[7, 7, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 7, 7]]
    draw = ExpertDraw(
        routing([step(hot), step([[1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]])])
    )
    out = draw.draw(50)
    assert out.sum(axis=1).tolist() == [100, 100]
    assert out.max() <= 50
    assert out[0, :2].sum() >= 80 and out[1, 6:].sum() >= 80


def test_an_unseen_size_draws_alike_in_each_run_whatever_came_before() -> None:
    """After `restart` (a run under other knobs) an unseen size after the same recorded step
    gets the same loads, though other sizes came in another order, and so does a fresh
    draw with the same seed; within a run the next step of that size follows the next
    recorded step of the nearest size."""
    a = [[5, 1, 0, 0], [0, 0, 3, 3]]
    b = [[0, 0, 1, 5], [3, 3, 0, 0]]
    c = [[10, 0, 10, 0], [0, 10, 0, 10]]
    draw = ExpertDraw(routing([step(a), step(b), step(c)]))
    small, large = draw.draw(5), draw.draw(40)  # nearest sizes 3 (a) and 10 (c)
    assert small[0, :2].sum() > small[0, 2:].sum()  # like a
    like_b = draw.draw(5)
    assert like_b[0, 2:].sum() > like_b[0, :2].sum()
    draw.restart()
    assert draw.draw(40).tolist() == large.tolist()
    assert draw.draw(5).tolist() == small.tolist()
    fresh = ExpertDraw(routing([step(a), step(b), step(c)]))
    assert fresh.draw(40).tolist() == large.tolist()


def test_no_routed_token_is_refused() -> None:
    with pytest.raises(ValueError, match="no recorded step"):
        ExpertDraw(routing([step([[0, 0]])]))


def test_routing_keeps_the_steps_that_routed_any_and_draws_them_as_the_steps_do() -> None:
    steps = [step([[2, 0, 2, 0]]), step([]), step([[0, 0, 0, 0]]), step([[1, 3, 0, 0]])]
    got = routing(steps)
    assert got.top_k == 2 and got.counts.tolist() == [[[2, 0, 2, 0]], [[1, 3, 0, 0]]]
    draw = ExpertDraw(got)
    a, b = [[2, 0, 2, 0]], [[1, 3, 0, 0]]
    assert [draw.draw(2).tolist() for _ in range(3)] == [a, b, a]
    assert routing([]).counts.shape == (0, 0, 0)
