"""StepWindow: per-step columns computed as frames arrive, bounded, tolerant of old frames."""

import math

import numpy as np
import pytest
from frames import frame, frames, old_frame

from dashboard.window import COLOURS, StepWindow, blocks, knob_label


def test_columns_hold_each_steps_numbers() -> None:
    view = StepWindow.of(frames(30))
    assert len(view) == 30 and view.steps.tolist() == list(range(30))
    assert view.col("occupancy") == pytest.approx([0.75] * 30)
    assert view.col("budget") == pytest.approx([18 / 64] * 30)
    assert view.col("kv.watermark") == pytest.approx([54] * 30)
    assert view.col("a2a.total") == pytest.approx([384] * 30)
    assert not view.col("a2a.measured").any()
    assert view.col("rank.imbalance") == pytest.approx([1.25] * 30)
    assert view.col("blocks.mean") == pytest.approx([(1 + 2 + 1) / 3] * 30)  # ctx 16, 20, 9
    assert view.col("blocks.max") == pytest.approx([2] * 30)
    assert view.col("queue.preempted").tolist() == [float(i % 5 == 0) for i in range(30)]
    assert view.imbalance.tolist() == [[2.0, 1.0]] * 30
    assert view.col("ttft.p50")[-1] == pytest.approx(np.percentile(range(30), 50))
    assert view.col("tok_s")[-1] == pytest.approx(1800)  # 18 tokens a step, 0.01 s apart
    assert view.expert_steps == 30 and view.expert_sum.tolist()[0] == [180, 60, 60, 60]
    assert view.latest is not None and view.latest["step"] == 29


def test_a_bounded_window_keeps_the_newest_steps_and_their_markers() -> None:
    window = StepWindow(maxlen=20)
    for i in range(100):
        window.add(frame(i, {"max_num_seqs": [8, i]} if i in (50, 90) else None))
    view = window.view()
    assert view.steps.tolist() == list(range(80, 100))
    assert view.markers == [(90, "v2: max_num_seqs 8→90")]
    assert window.view(5).steps.tolist() == list(range(95, 100))
    assert window.view(5).markers == []
    assert len(window._markers) == 1  # the one at step 50 is gone for good
    assert window.view(5).col("ttft.p50")[-1] == pytest.approx(np.percentile(range(36, 100), 50))


def test_a_new_session_starts_the_window_over() -> None:
    window = StepWindow(maxlen=50)
    for i in range(30):
        window.add(frame(1000 + i, {"max_num_seqs": [8, 4]} if i == 5 else None))
    restarted = [{**frame(i), "session": "t"} for i in range(3)]
    for f in restarted:
        window.add(f)
    view = window.view()
    assert view.steps.tolist() == [0, 1, 2] and view.markers == []
    assert view.expert_steps == 3 and view.col("ttft.p50")[-1] == pytest.approx(1.0)


def test_requests_keep_their_colour_while_they_run() -> None:
    view = StepWindow.of(frames(12))
    a_colour = view.slots[0].colours[1]
    assert all(column.colours[1] == a_colour for column in view.slots)  # request "a"
    assert view.slots[0].colours[2] != a_colour  # request "b"
    prefill_colours = {column.colours[0] for column in view.slots}
    assert prefill_colours <= set(range(COLOURS)) and len(prefill_colours) == COLOURS
    assert view.slots[3].texts[1] == "a decode 1 tok, ctx 20"
    assert view.slots[3].prefill == [0]


def test_old_frames_without_rank_loads_or_watermark() -> None:
    view = StepWindow.of([old_frame(i) for i in range(4)])
    assert all(math.isnan(x) for x in view.col("rank.imbalance"))
    assert view.col("kv.watermark") == pytest.approx([60] * 4)  # usable: no watermark known


def test_an_empty_window_has_an_empty_view() -> None:
    view = StepWindow().view()
    assert len(view) == 0 and view.latest is None and view.markers == []
    assert view.steps.tolist() == [] and view.imbalance.shape == (0, 0)


def test_helpers() -> None:
    assert blocks(frame(0)) == [(0, "p0", 1, 16), (1, "a", 2, 20), (2, "b", 1, 9)]
    assert (
        knob_label({"max_num_seqs": [8, 4], "policy": ["fcfs", "priority"]})
        == "max_num_seqs 8→4, policy fcfs→priority"
    )
