"""Chart functions on synthetic telemetry frames: traces, axes and knob-change markers."""

import math

import pytest
from frames import frames

from dashboard import charts


def _names(fig) -> list[str]:
    return [t.name for t in fig.data]


def test_every_live_figure_builds_and_time_series_carry_the_knob_marker() -> None:
    figs = charts.live_figures(frames())
    assert set(figs) == {"batch", "usage", "kv", "experts", "imbalance", "a2a", "latency",
                         "throughput", "step_time", "queues"}
    for name in ("batch", "usage", "kv", "imbalance", "latency", "throughput", "step_time",
                 "queues"):
        fig = figs[name]
        assert [s.x0 for s in fig.layout.shapes] == [10], name
        assert fig.layout.annotations[-1].text == "v2: max_num_seqs 8→4", name


def test_empty_frames_do_not_fail() -> None:
    for fig in charts.live_figures([]).values():
        assert fig.layout.title.text


def test_batch_heatmap_colours_by_request_and_marks_prefill() -> None:
    fig = charts.batch_heatmap(frames(5))
    heat, prefill = fig.data
    assert heat.type == "heatmap" and list(heat.x) == [0, 1, 2, 3, 4]
    assert len(heat.z) == 4  # max_slots rows
    assert math.isnan(heat.z[3][0])  # slot 3 is empty
    assert heat.z[1][0] == heat.z[1][4] != heat.z[2][0]  # one colour per request
    assert prefill.name == "prefill" and list(prefill.y) == [0] * 5
    assert fig.layout.yaxis.title.text == "slot"


def test_usage_fractions() -> None:
    occ, budget = charts.batch_usage(frames(3)).data
    assert occ.y == pytest.approx([0.75] * 3)
    assert budget.y == pytest.approx([18 / 64] * 3)


def test_kv_stacked_with_usable_and_watermark() -> None:
    fig = charts.kv_area(frames(3))
    assert _names(fig) == ["used", "cached", "free", "usable", "watermark"]
    assert {t.stackgroup for t in fig.data[:3]} == {"kv"}
    assert list(fig.data[4].y) == [54] * 3


def test_experts_latest_and_rolling_and_imbalance() -> None:
    fig = charts.expert_heatmaps(frames(30), window=10)
    latest, rolling = fig.data
    assert latest.z.tolist() == [[6, 2, 2, 2], [3, 3, 3, 3]]
    assert rolling.z.tolist()[0] == [60, 20, 20, 20]
    assert fig.layout.annotations[1].text == "last 10 steps"
    imb = charts.imbalance(frames(3))
    assert _names(imb) == ["layer 0", "layer 1"]
    assert imb.data[0].y == pytest.approx([2.0] * 3) and imb.data[1].y == pytest.approx([1.0] * 3)


def test_a2a_is_labelled_with_its_mode() -> None:
    fig = charts.a2a_heatmap(frames(2))
    assert "modeled" in fig.layout.title.text
    assert [list(r) for r in fig.data[0].z] == [[0, 128], [256, 0]]
    assert fig.layout.yaxis.title.text == "source rank"


def test_latency_throughput_step_time_queues() -> None:
    fs = frames(101)
    lat = charts.latency(fs, window=64)
    assert _names(lat) == ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    assert lat.data[0].y[-1] == pytest.approx(68.5)  # median of the last 64 steps' TTFT 37..100
    thr = charts.throughput(fs, window=20)
    assert thr.data[0].y[0] is None and thr.data[0].y[-1] == pytest.approx(1800)
    assert thr.data[1].y[-1] == pytest.approx(200)
    st = charts.step_time(fs)
    assert _names(st) == ["schedule", "prepare", "forward", "sample", "moe (within forward)"]
    q = charts.queues(fs)
    assert _names(q) == ["waiting", "running", "swapped", "preempted"]
    assert q.data[3].type == "bar"
