"""The live charts' panels in JavaScript on windows of synthetic frames: traces, axes and knob
markers (the Live, Replay and Compare pages all draw these)."""

import html
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM
from frames import REASONS, autopilot_change, frame, frames, old_frame, recorded
from js_modules import ORIGIN, blank_page, js_page, js_panel, run
from playwright.sync_api import Page, expect

from dashboard.compare_page import CHARTS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]

PANELS = ("batch", "usage", "kv", "queues", "kv_blocks", "experts", "imbalance", "a2a")
PANELS += ("a2a_volume", "ranks", "latency", "throughput", "step_time")
TIME_SERIES = tuple(p for p in PANELS if p not in ("experts", "a2a"))
Figure = dict[str, Any]
Marker = tuple[int, str, str | None]  # step, label, reason (None: none given)
MARKER = "#d62728"
AUTOPILOT_MARKER = "#9467bd"  # the autopilot's changes, apart from a person's
# a reason with what plotly would read as tags and entities, and a line of just such words
MARKUP = "a <b>tag</b> & &lt; 1 < 2 <br> " + "<" * 79


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with js_page() as p:
        yield p


def _names(fig: Figure) -> list[str]:
    return [t.get("name") for t in fig["data"]]


def _title(fig: Figure) -> str:
    return fig["layout"]["title"]["text"]


def test_time_series_carry_the_knob_marker_on_a_fixed_span(page: Page) -> None:
    for name in TIME_SERIES:
        fig = js_panel(page, name, frames())
        layout = fig["layout"]
        assert [s["x0"] for s in layout["shapes"]] == [10], name
        assert layout["annotations"][-1]["text"] == "v2: max_num_seqs 8→4", name
        assert _title(fig), name
        axis = layout["xaxis2"] if name in ("kv_blocks", "ranks") else layout["xaxis"]
        assert axis["range"] == [-0.5, 29.5], name  # labels must not widen it


def test_an_empty_window_draws_every_panel(page: Page) -> None:
    for name in PANELS:
        assert _title(js_panel(page, name, [])), name


def test_batch_heatmap_colours_by_request_and_marks_prefill(page: Page) -> None:
    fig = js_panel(page, "batch", frames(5))
    heat, prefill = fig["data"]
    assert heat["type"] == "heatmap" and heat["x"] == [0, 1, 2, 3, 4]
    assert len(heat["z"]) == 4  # max_slots rows
    assert heat["z"][3][0] is None  # slot 3 is empty
    assert heat["z"][1][0] == heat["z"][1][4] != heat["z"][2][0]  # one colour per request
    assert heat["text"][1][0] == "a decode 1 tok, ctx 20"
    assert prefill["name"] == "prefill" and prefill["y"] == [0] * 5
    assert fig["layout"]["yaxis"]["title"]["text"] == "slot"


def test_usage_and_kv(page: Page) -> None:
    occ, budget = js_panel(page, "usage", frames(3))["data"]
    assert occ["y"] == pytest.approx([0.75] * 3) and budget["y"] == pytest.approx([18 / 64] * 3)
    kv = js_panel(page, "kv", frames(3))
    assert _names(kv) == ["used", "cached", "free", "usable", "watermark"]
    assert {t["stackgroup"] for t in kv["data"][:3]} == {"kv"}
    assert kv["data"][4]["y"] == [54] * 3


def test_kv_blocks_per_running_request(page: Page) -> None:
    fig = js_panel(page, "kv_blocks", frames(4))
    bars, peak, mean = fig["data"]
    assert bars["type"] == "bar" and bars["x"] == ["slot 0", "slot 1", "slot 2"]
    assert bars["y"] == [1, 2, 1] and bars["customdata"] == [["p3", 16], ["a", 20], ["b", 9]]
    assert (mean["name"], mean["xaxis"], mean["yaxis"]) == ("mean per request", "x2", "y2")
    assert mean["y"] == pytest.approx([4 / 3] * 4) and peak["y"] == [2] * 4
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["latest step", "over steps"]
    assert fig["layout"]["xaxis2"]["domain"] == [0.55, 1]


def test_experts_latest_and_rolling_and_imbalance(page: Page) -> None:
    fig = js_panel(page, "experts", frames(30))
    latest, rolling = fig["data"]
    assert latest["z"] == [[6, 2, 2, 2], [3, 3, 3, 3]]
    assert rolling["z"][0] == [180, 60, 60, 60]
    assert fig["layout"]["annotations"][1]["text"] == "last 30 steps"
    imb = js_panel(page, "imbalance", frames(3))
    assert _names(imb) == ["layer 0", "layer 1"]
    assert imb["data"][0]["y"] == [2.0] * 3 and imb["data"][1]["y"] == [1.0] * 3
    dropping = [frame(i) for i in range(3)]
    dropping[1]["experts"]["dropped"] = [2, 1]
    imb = js_panel(page, "imbalance", dropping)
    assert imb["data"][-1]["name"] == "dropped tokens" and imb["data"][-1]["y"] == [0, 3, 0]
    assert imb["layout"]["yaxis2"]["overlaying"] == "y"


def test_a2a_is_labelled_with_its_mode_and_its_volume_split_by_mode(page: Page) -> None:
    fig = js_panel(page, "a2a", frames(2))
    assert "modeled" in _title(fig) and fig["data"][0]["z"] == [[0, 128], [256, 0]]
    assert fig["layout"]["yaxis"]["title"]["text"] == "source rank"
    fs = frames(4)
    fs[2]["a2a"] = {
        **fs[2]["a2a"],
        "mode": "measured",
        "bytes": [[0, 1000], [24, 0]],
        "gather_bytes": [[0, 0], [0, 0]],
    }
    measured, modeled, gather = js_panel(page, "a2a_volume", fs)["data"]
    assert measured["name"] == "measured bytes" and modeled["name"] == "modeled bytes"
    assert math.isnan(measured["y"][0]) and measured["y"][2] == 1024
    assert modeled["y"][0] == 384 and math.isnan(modeled["y"][2])
    assert gather["name"] == "modeled all-gather" and gather["line"]["dash"] == "dot"
    assert gather["y"][0] == 128 and math.isnan(gather["y"][2])
    title = _title(js_panel(page, "a2a_volume", fs))
    assert title == "All-to-all volume per step (measured and modeled)"
    only = js_panel(page, "a2a_volume", [old_frame(i) for i in range(2)])
    assert _names(only) == ["modeled bytes"] and "(modeled)" in _title(only)


def test_rank_load_bars_and_imbalance_over_time(page: Page) -> None:
    fs = frames(3)
    fs[2]["a2a"] = {
        **fs[2]["a2a"],
        "mode": "measured",
        "rank_tokens": [12, 4],
        "rank_moe_ms": [0.5, 0.25],
        "imbalance": 1.5,
        "placement_version": 2,
    }
    fig = js_panel(page, "ranks", fs)
    bars, line = fig["data"]
    assert bars["x"] == ["rank 0", "rank 1"] and bars["y"] == [12, 4]
    assert bars["hovertext"] == ["0.500 ms MoE", "0.250 ms MoE"]
    assert line["y"] == pytest.approx([1.25, 1.25, 1.5]) and line["xaxis"] == "x2"
    assert "placement v2" in _title(fig)
    old = js_panel(page, "ranks", [old_frame(i) for i in range(3)])
    assert "no per-rank loads" in _title(old)
    assert old["data"][0]["y"] == [] and all(math.isnan(y) for y in old["data"][1]["y"])


def test_latency_throughput_step_time_queues(page: Page) -> None:
    steps = frames(101)
    lat = js_panel(page, "latency", steps)
    assert _names(lat) == ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    assert lat["data"][0]["y"][-1] == pytest.approx(68.5)  # median of TTFT 37..100
    assert lat["data"][2]["yaxis"] == "y2"
    assert lat["layout"]["yaxis2"]["title"]["text"] == "TPOT ms"
    thr = js_panel(page, "throughput", steps)["data"]
    assert math.isnan(thr[0]["y"][0]) and thr[0]["y"][-1] == pytest.approx(1800)
    assert thr[1]["y"][-1] == pytest.approx(200)
    st = js_panel(page, "step_time", steps)
    assert _names(st) == ["schedule", "prepare", "forward", "sample", "moe (within forward)"]
    q = js_panel(page, "queues", steps)
    assert _names(q) == ["waiting", "running", "swapped", "preempted"]
    assert q["data"][3]["type"] == "bar" and q["data"][3]["yaxis"] == "y2"
    assert q["layout"]["yaxis2"]["range"] == [0, 1.05] and q["layout"]["yaxis2"]["dtick"] == 1


def test_the_compare_pages_panels_are_the_components(page: Page) -> None:
    """Every panel the Compare page names is one of the component's, with its traces."""
    assert set(CHARTS) <= set(PANELS)
    for name in CHARTS:
        fig = js_panel(page, name, frames())
        assert fig["data"] and all(len(t["x"]) == 30 for t in fig["data"]), name


def test_the_autopilots_markers_are_named_and_coloured_apart(page: Page) -> None:
    """A person's change at step 10 and the autopilot's at step 20: the label says who, the
    colour differs."""
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, REASONS[0])]
    layout = js_panel(page, "latency", steps)["layout"]
    person, pilot = layout["annotations"][-2:]
    assert person["text"] == "v2: max_num_seqs 8→4" and "hovertext" not in person
    assert pilot["text"] == "v3 autopilot: max_num_seqs 4→8"
    assert pilot["hovertext"] == _hover(page, REASONS[0])
    assert pilot["hovertext"].replace("<br>", " ") == REASONS[0]
    assert person["font"]["color"] == MARKER and pilot["font"]["color"] == AUTOPILOT_MARKER
    colours = [s["line"]["color"] for s in layout["shapes"]]
    assert colours == [MARKER, AUTOPILOT_MARKER]
    assert [s["x0"] for s in layout["shapes"]] == [10, 20]


def _hover(page: Page, reason: str | None) -> str:
    return run(page, "(m, reason) => m.hoverText(reason)", reason)


def test_a_markers_hover_holds_its_reason_wrapped(page: Page) -> None:
    """Each reason, long, oddly spaced, with a word longer than a line or characters outside
    the BMP, or none at all, is a marker's hover text: the reason's words in order, in lines
    of at most 80 characters (counted in code points) unless one word is longer."""
    marks: list[Marker] = [
        (i, f"v{i} autopilot: max_num_seqs 1→2", r) for i, r in enumerate(REASONS)
    ]
    marks += [(9, "v9: max_num_seqs 2→1", None), (10, "v10: max_num_seqs 1→2", "")]
    shapes, notes = run(page, "(m, marks) => m.markers(marks)", marks)
    assert [(s["x0"], s["x1"], s["line"]["dash"]) for s in shapes] == [
        (i, i, "dash") for i, *_ in marks
    ]
    assert [n["text"] for n in notes] == [label for _, label, _ in marks]
    assert [n["font"]["color"] for n in notes] == [AUTOPILOT_MARKER] * len(REASONS) + [MARKER] * 2
    hovers = [note.get("hovertext") for note in notes]
    assert hovers[-3:] == [None, None, None]  # blank, none, empty: no hover
    for reason, hover in zip(REASONS[:-1], hovers[:-3], strict=True):
        lines = hover.split("<br>")
        assert " ".join(lines).split() == reason.split()
        assert all(len(line) <= 80 or " " not in line for line in lines), lines
        assert len(lines) >= 2
    assert hovers[0].startswith("p90 TTFT 1.9 s > 800 ms target (70% of p90 TTFT is queueing")
    assert hovers[2].split("<br>")[0] == "🚀" * 50 + " 🚀🚀" * 10  # code points, as Python counts
    assert hovers[3] == f"{'c' * 39} {'d' * 40}<br>{'a' * 40}<br>{'b' * 40}"  # 80 fit, 81 not
    escaped = "a &lt;b>tag&lt;/b> &amp; &amp;lt; 1 &lt; 2 &lt;br><br>" + "&lt;" * 79
    assert _hover(page, MARKUP) == escaped


def test_a_recorded_autopilot_change_shows_its_reason_on_the_replayed_chart(
    page: Page, tmp_path: Path
) -> None:
    """The replay page draws the recorded steps in the browser: the reason the recorder kept
    is the marker's hover."""
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, REASONS[0])]
    replayed, changes = recorded(steps, tmp_path)
    assert [c["reason"] for c in changes] == [None, REASONS[0]]
    person, pilot = js_panel(page, "latency", replayed)["layout"]["annotations"][-2:]
    assert "hovertext" not in person
    assert pilot["hovertext"].replace("<br>", " ") == REASONS[0]


DRAW = """(fig) => {
    const div = document.createElement("div");
    div.style.width = "900px";
    document.body.appendChild(div);
    return Plotly.newPlot(div, fig.data, fig.layout).then(() => undefined);
}"""


@pytest.mark.parametrize("reason", [REASONS[0], MARKUP])
def test_plotly_shows_the_reason_when_the_autopilots_marker_is_hovered(
    page: Page, reason: str
) -> None:
    """Drawn by plotly.js, hovering the autopilot's label shows its reason, a line per <br>,
    tag-like words in it as written."""
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, reason)]
    fig = js_panel(page, "latency", steps)
    assert page.context.browser is not None
    drawn = blank_page(page.context.browser)
    try:
        drawn.add_script_tag(url=f"{ORIGIN}/plotly.min.js")
        drawn.evaluate(DRAW, fig)
        drawn.locator(".annotation").nth(1).hover()
        lines = drawn.locator(".hoverlayer .hovertext text tspan.line")
        wrapped = _hover(page, reason).split("<br>")
        expect(lines).to_have_count(len(wrapped))
        shown = [lines.nth(i).text_content() for i in range(lines.count())]
        assert shown == [html.unescape(line) for line in wrapped]
        assert " ".join(shown).split() == reason.split()
    finally:
        drawn.close()
