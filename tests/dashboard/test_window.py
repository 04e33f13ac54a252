"""StepWindow: per-step columns computed as frames arrive, bounded, tolerant of old frames."""

import numpy as np
import pytest
from frames import REASONS, autopilot_change, frame, frames, old_frame

from dashboard.window import StepWindow, knob_label


def test_columns_hold_each_steps_numbers() -> None:
    view = StepWindow.of(frames(30))
    assert len(view) == 30 and view.steps.tolist() == list(range(30))
    assert view.col("kv.watermark") == pytest.approx([54] * 30)
    assert view.col("queue.preempted").tolist() == [float(i % 5 == 0) for i in range(30)]
    assert view.imbalance.tolist() == [[2.0, 1.0]] * 30
    assert view.col("ttft.p50")[-1] == pytest.approx(np.percentile(range(30), 50))
    assert view.col("tok_s")[-1] == pytest.approx(1800)  # 18 tokens a step, 0.01 s apart
    assert view.markers == [(10, "v2: max_num_seqs 8→4", None)]  # a person gave no reason


def test_a_bounded_window_keeps_the_newest_steps_and_their_markers() -> None:
    window = StepWindow(maxlen=20)
    for i in range(100):
        window.add(frame(i, {"max_num_seqs": [8, i]} if i in (50, 90) else None))
    view = window.view()
    assert view.steps.tolist() == list(range(80, 100))
    assert view.markers == [(90, "v2: max_num_seqs 8→90", None)]
    assert window.view(5).steps.tolist() == list(range(95, 100))
    assert window.view(5).markers == []
    assert len(window._markers) == 1  # the one at step 50 is gone for good
    assert window.view(5).col("ttft.p50")[-1] == pytest.approx(np.percentile(range(36, 100), 50))


def test_a_new_session_starts_the_window_over() -> None:
    window = StepWindow(maxlen=50)
    for i in range(30):
        window.add(frame(1000 + i, {"max_num_seqs": [8, 4]} if i == 5 else None))
    for f in [{**frame(i), "session": "t"} for i in range(3)]:
        window.add(f)
    view = window.view()
    assert view.steps.tolist() == [0, 1, 2] and view.markers == []
    assert view.col("ttft.p50")[-1] == pytest.approx(1.0)


def test_an_autopilot_marker_keeps_its_reason() -> None:
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, REASONS[0])]
    assert StepWindow.of(steps).markers == [
        (10, "v2: max_num_seqs 8→4", None),
        (20, "v3 autopilot: max_num_seqs 4→8", REASONS[0]),
    ]


def test_old_frames_without_the_watermark() -> None:
    view = StepWindow.of([old_frame(i) for i in range(4)])
    assert view.col("kv.watermark") == pytest.approx([60] * 4)  # usable: no watermark known


def test_an_empty_window_has_an_empty_view() -> None:
    view = StepWindow().view()
    assert len(view) == 0 and view.markers == []
    assert view.steps.tolist() == [] and view.imbalance.shape == (0, 0)


def test_knob_label() -> None:
    assert (
        knob_label({"max_num_seqs": [8, 4], "policy": ["fcfs", "priority"]})
        == "max_num_seqs 8→4, policy fcfs→priority"
    )
