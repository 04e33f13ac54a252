"""Chart functions on a window of synthetic telemetry frames: traces, axes and knob markers."""

import math

import numpy as np
import pytest
from frames import frame, frames, old_frame

from dashboard import charts
from dashboard.window import StepWindow

TIME_SERIES = (
    "batch",
    "usage",
    "kv",
    "kv_blocks",
    "queues",
    "step_time",
    "imbalance",
    "a2a_volume",
    "ranks",
    "latency",
    "throughput",
)


def _names(fig) -> list[str]:
    return [t.name for t in fig.data]


def test_every_live_figure_builds_and_time_series_carry_the_knob_marker() -> None:
    figs = charts.live_figures(StepWindow.of(frames()))
    assert set(figs) == set(TIME_SERIES) | {"experts", "a2a"}
    for name in TIME_SERIES:
        fig = figs[name]
        assert [s.x0 for s in fig.layout.shapes] == [10], name
        assert fig.layout.annotations[-1].text == "v2: max_num_seqs 8→4", name
        assert fig.layout.title.text, name
        time_axis = fig.layout.xaxis2 if name in ("kv_blocks", "ranks") else fig.layout.xaxis
        assert time_axis.range == (-0.5, 29.5), name  # labels must not widen it


def test_empty_window_does_not_fail() -> None:
    for fig in charts.live_figures(StepWindow().view()).values():
        assert fig.layout.title.text


def test_batch_heatmap_colours_by_request_and_marks_prefill() -> None:
    fig = charts.batch_heatmap(StepWindow.of(frames(5)))
    heat, prefill = fig.data
    assert heat.type == "heatmap" and list(heat.x) == [0, 1, 2, 3, 4]
    assert len(heat.z) == 4  # max_slots rows
    assert math.isnan(heat.z[3][0])  # slot 3 is empty
    assert heat.z[1][0] == heat.z[1][4] != heat.z[2][0]  # one colour per request
    assert heat.text[1][0] == "a decode 1 tok, ctx 20"
    assert prefill.name == "prefill" and list(prefill.y) == [0] * 5
    assert fig.layout.yaxis.title.text == "slot"


def test_usage_fractions() -> None:
    occ, budget = charts.batch_usage(StepWindow.of(frames(3))).data
    assert occ.y == pytest.approx([0.75] * 3)
    assert budget.y == pytest.approx([18 / 64] * 3)


def test_kv_stacked_with_usable_and_watermark() -> None:
    fig = charts.kv_area(StepWindow.of(frames(3)))
    assert _names(fig) == ["used", "cached", "free", "usable", "watermark"]
    assert {t.stackgroup for t in fig.data[:3]} == {"kv"}
    assert list(fig.data[4].y) == [54] * 3


def test_kv_blocks_per_running_request() -> None:
    fig = charts.kv_blocks(StepWindow.of(frames(4)))
    bars, peak, mean = fig.data
    assert bars.type == "bar" and list(bars.x) == ["slot 0", "slot 1", "slot 2"]
    assert list(bars.y) == [1, 2, 1]
    assert [list(c) for c in bars.customdata] == [["p3", 16], ["a", 20], ["b", 9]]
    assert (mean.name, mean.xaxis, mean.yaxis) == ("mean per request", "x2", "y2")
    assert mean.y == pytest.approx([4 / 3] * 4) and peak.y == pytest.approx([2] * 4)
    assert [a.text for a in fig.layout.annotations] == ["latest step", "over steps"]
    assert fig.layout.xaxis2.domain == (0.55, 1)


def test_experts_latest_and_rolling_and_imbalance() -> None:
    fig = charts.expert_heatmaps(StepWindow.of(frames(30)))
    latest, rolling = fig.data
    assert [list(r) for r in latest.z] == [[6, 2, 2, 2], [3, 3, 3, 3]]
    assert rolling.z.tolist()[0] == [180, 60, 60, 60]
    assert fig.layout.annotations[1].text == "last 30 steps"
    imb = charts.imbalance(StepWindow.of(frames(3)))
    assert _names(imb) == ["layer 0", "layer 1"]
    assert imb.data[0].y == pytest.approx([2.0] * 3) and imb.data[1].y == pytest.approx([1.0] * 3)
    dropping = [frame(i) for i in range(3)]
    dropping[1]["experts"]["dropped"] = [2, 1]
    imb = charts.imbalance(StepWindow.of(dropping))
    assert imb.data[-1].name == "dropped tokens" and list(imb.data[-1].y) == [0, 3, 0]
    assert imb.layout.yaxis2.overlaying == "y"


def test_a2a_is_labelled_with_its_mode() -> None:
    fig = charts.a2a_heatmap(StepWindow.of(frames(2)))
    assert "modeled" in fig.layout.title.text
    assert [list(r) for r in fig.data[0].z] == [[0, 128], [256, 0]]
    assert fig.layout.yaxis.title.text == "source rank"


def test_a2a_volume_is_the_sum_per_step_split_by_mode() -> None:
    fs = frames(4)
    fs[2]["a2a"] = {
        **fs[2]["a2a"],
        "mode": "measured",
        "bytes": [[0, 1000], [24, 0]],
        "gather_bytes": [[0, 0], [0, 0]],
    }
    fig = charts.a2a_volume(StepWindow.of(fs))
    measured, modeled, gather = fig.data
    assert measured.name == "measured bytes" and modeled.name == "modeled bytes"
    assert np.isnan(measured.y[0]) and measured.y[2] == 1024
    assert modeled.y[0] == 384 and np.isnan(modeled.y[2])
    assert gather.name == "modeled all-gather" and gather.line.dash == "dot"
    assert gather.y[0] == 128 and np.isnan(gather.y[2])
    assert fig.layout.title.text == "All-to-all volume per step (measured and modeled)"
    only_modeled = charts.a2a_volume(StepWindow.of(old_frame(i) for i in range(2)))
    assert (
        _names(only_modeled) == ["modeled bytes"] and "(modeled)" in only_modeled.layout.title.text
    )


def test_rank_load_bars_and_imbalance_over_time() -> None:
    fs = frames(3)
    fs[2]["a2a"] = {
        **fs[2]["a2a"],
        "mode": "measured",
        "rank_tokens": [12, 4],
        "rank_moe_ms": [0.5, 0.25],
        "imbalance": 1.5,
        "placement_version": 2,
    }
    fig = charts.ranks(StepWindow.of(fs))
    bars, line = fig.data
    assert list(bars.x) == ["rank 0", "rank 1"] and list(bars.y) == [12, 4]
    assert list(bars.hovertext) == ["0.500 ms MoE", "0.250 ms MoE"]
    assert line.y == pytest.approx([1.25, 1.25, 1.5]) and line.xaxis == "x2"
    assert "placement v2" in fig.layout.title.text
    old = charts.ranks(StepWindow.of([old_frame(i) for i in range(3)]))
    assert "no per-rank loads" in old.layout.title.text
    assert len(old.data[0].y) == 0 and all(np.isnan(old.data[1].y))


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
