"""The server-drawn figures on a window of synthetic telemetry frames: the Compare page's
panels (traces, axes and knob markers) and the sidebar's expert placement."""

from pathlib import Path

import numpy as np
import pytest
from frames import REASONS, autopilot_change, frame, frames, recorded

from dashboard import charts, compare_page
from dashboard.window import StepWindow


def _names(fig) -> list[str]:
    return [t.name for t in fig.data]


def test_every_compare_figure_carries_the_knob_marker_on_a_fixed_span() -> None:
    view = StepWindow.of(frames())
    for name, build in compare_page.FIGURES.items():
        fig = build(view)
        assert [s.x0 for s in fig.layout.shapes] == [10], name
        assert fig.layout.annotations[-1].text == "v2: max_num_seqs 8→4", name
        assert fig.layout.title.text, name
        assert fig.layout.xaxis.range == (-0.5, 29.5), name  # labels must not widen it


def test_a_recorded_autopilot_change_shows_its_reason_on_the_compare_pages_markers(
    tmp_path: Path,
) -> None:
    """The Compare page draws markers from the recorded steps: the reason the recorder kept
    for a change is the hover of its marker on every chart; a person's change has none."""
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, REASONS[0])]
    recorded_steps, changes = recorded(steps, tmp_path)
    assert [c["reason"] for c in changes] == [None, REASONS[0]]
    view = StepWindow.of(recorded_steps)
    for name, build in compare_page.FIGURES.items():
        person, pilot = build(view).layout.annotations[-2:]
        assert pilot.text == "v3 autopilot: max_num_seqs 4→8", name
        assert pilot.hovertext.replace("<br>", " ") == REASONS[0], name
        assert "<br>" in pilot.hovertext, name  # wrapped: it is 200 characters long
        assert person.text == "v2: max_num_seqs 8→4" and person.hovertext is None, name


def test_an_empty_window_does_not_fail() -> None:
    for build in compare_page.FIGURES.values():
        assert build(StepWindow().view()).layout.title.text


def test_kv_stacked_with_usable_and_watermark() -> None:
    fig = charts.kv_area(StepWindow.of(frames(3)))
    assert _names(fig) == ["used", "cached", "free", "usable", "watermark"]
    assert {t.stackgroup for t in fig.data[:3]} == {"kv"}
    assert list(fig.data[4].y) == [54] * 3


def test_imbalance_per_layer_and_dropped_tokens() -> None:
    imb = charts.imbalance(StepWindow.of(frames(3)))
    assert _names(imb) == ["layer 0", "layer 1"]
    assert imb.data[0].y == pytest.approx([2.0] * 3) and imb.data[1].y == pytest.approx([1.0] * 3)
    dropping = [frame(i) for i in range(3)]
    dropping[1]["experts"]["dropped"] = [2, 1]
    imb = charts.imbalance(StepWindow.of(dropping))
    assert imb.data[-1].name == "dropped tokens" and list(imb.data[-1].y) == [0, 3, 0]
    assert imb.layout.yaxis2.overlaying == "y"


def test_placement_map_shows_each_experts_rank_and_replicas() -> None:
    info = {
        "ep_size": 2,
        "mode": "measured",
        "version": 3,
        "placement": [[[0, 1, 2], [2, 3]], [[3, 1], [0, 2]]],
    }
    (heat,) = charts.placement_map(info).data
    assert [list(row) for row in heat.z] == [[0, 0, 0, 1], [1, 0, 1, 0]]
    assert [list(row) for row in heat.text] == [["", "", "0+1", ""], ["", "", "", ""]]
    assert charts.placement_map(info).layout.title.text == "Placement v3 (measured)"


def test_latency_throughput_step_time_queues() -> None:
    view = StepWindow.of(frames(101))
    lat = charts.latency(view)
    assert _names(lat) == ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    assert lat.data[0].y[-1] == pytest.approx(68.5)  # median of the last 64 steps' TTFT 37..100
    assert lat.data[2].yaxis == "y2" and lat.layout.yaxis2.title.text == "TPOT ms"
    thr = charts.throughput(view)
    assert np.isnan(thr.data[0].y[0]) and thr.data[0].y[-1] == pytest.approx(1800)
    assert thr.data[1].y[-1] == pytest.approx(200)
    st = charts.step_time(view)
    assert _names(st) == ["schedule", "prepare", "forward", "sample", "moe (within forward)"]
    q = charts.queues(view)
    assert _names(q) == ["waiting", "running", "swapped", "preempted"]
    assert q.data[3].type == "bar" and q.data[3].yaxis == "y2"
    assert q.layout.yaxis2.range == (0, 1.05) and q.layout.yaxis2.dtick == 1  # whole counts
