"""The live charts' statistics in JavaScript give the project's numbers: the percentile
against stats, the rolling statistics against the same numbers worked out from scratch, the
window's columns, and the feed's handling of what it cannot read."""

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser import CHROMIUM
from frames import REASONS, autopilot_change, frame, frames, old_frame
from js_modules import js_page, js_view, run
from playwright.sync_api import Page

from stats import percentile, ranked_percentile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with js_page() as p:
        yield p


def test_percentile_is_the_projects(page: Page) -> None:
    rng = random.Random(1)
    cases = [
        (sorted(rng.uniform(-50, 50) for _ in range(rng.randint(1, 40))), q)
        for q in (0, 1, 25, 50, 90, 99, 100, 33.3)
        for _ in range(10)
    ]
    got = run(page, "(m, cases) => cases.map(([xs, q]) => m.rankedPercentile(xs, q))", cases)
    assert got == [ranked_percentile(xs, q) for xs, q in cases]  # exactly
    assert got == pytest.approx([np.percentile(xs, q) for xs, q in cases])


ROLLING = """(m, {values, rates, sums}) => {
    const p = new m.RollingPercentiles(16);
    const r = new m.RollingRate(3, 2);
    const s = new m.RollingSum(3);
    return {
        percentiles: values.map((v) => p.add(v)),
        rates: rates.map(([t, counts]) => r.add(t, counts)),
        sums: sums.map((a) => { s.add(a); return [s.total, s.count]; }),
    };
}"""


def test_rolling_statistics_match_a_recount_from_scratch(page: Page) -> None:
    """Updated a step at a time, each statistic is the one worked out afresh over its window:
    the percentiles (`stats.percentile`, exactly) of the last 16 values, the rates over the
    last 3 steps, the sums of the last 3 matrices."""
    rng = random.Random(2)
    values = [
        [rng.choice([1.0, 2.0, rng.uniform(0, 100)]) for _ in range(rng.randint(0, 3))]
        for _ in range(200)
    ]
    rates = [
        (rng.choice([0.0, 0.25]) * i, [rng.randint(0, 50), rng.randint(0, 5)]) for i in range(40)
    ]
    sums = [[[rng.randint(0, 9)] * w for _ in range(2)] for w in [2] * 6 + [3] * 4]
    got = run(page, ROLLING, {"values": values, "rates": rates, "sums": sums})
    seen: list[float] = []
    for new, (p50, p99) in zip(values, got["percentiles"], strict=True):
        seen += new
        want = [percentile(seen[-16:], q) for q in (50, 99)]
        if seen:
            assert [p50, p99] == want
        else:
            assert math.isnan(p50) and math.isnan(p99)
    for i, ((t, _), rate) in enumerate(zip(rates, got["rates"], strict=True)):
        # the counts of the steps after the window's first (3 back), over the time since it
        first = max(0, i - 3)
        span = t - rates[first][0]
        counts = np.sum([c for _, c in rates[first + 1 : i + 1]] or [[0, 0]], axis=0)
        if span <= 0:
            assert all(math.isnan(x) for x in rate)
        else:
            assert rate == pytest.approx(counts / span)
    # the sum of the last 3 matrices, started over when their shape changes (after the 6th)
    want_sums = [
        sums[max(0, i - 2) : i + 1] if i < 6 else sums[max(6, i - 2) : i + 1] for i in range(10)
    ]
    assert got["sums"] == [[np.sum(w, axis=0).tolist(), len(w)] for w in want_sums]


def test_a_new_session_starts_the_window_over(page: Page) -> None:
    steps = [frame(1000 + i, {"max_num_seqs": [8, 4]} if i == 5 else None) for i in range(30)]
    steps += [{**frame(i), "session": "t"} for i in range(3)]
    got = js_view(page, steps, maxlen=50)
    assert got["columns"]["step"] == [0, 1, 2] and got["markers"] == []
    assert got["columns"]["ttft.p50"][-1] == pytest.approx(1.0)  # TTFTs 0, 1, 2 only


def test_an_autopilot_marker_keeps_its_reason(page: Page) -> None:
    steps = frames()
    steps[20]["knob_changes"] = [autopilot_change(3, {"max_num_seqs": [4, 8]}, REASONS[0])]
    assert js_view(page, steps)["markers"] == [
        [10, "v2: max_num_seqs 8→4", None],
        [20, "v3 autopilot: max_num_seqs 4→8", REASONS[0]],
    ]


def test_columns_hold_each_steps_numbers(page: Page) -> None:
    got = js_view(page, frames(30))
    col = got["columns"]
    assert got["length"] == 30 and col["step"] == list(range(30))
    assert col["occupancy"] == pytest.approx([0.75] * 30)
    assert col["budget"] == pytest.approx([18 / 64] * 30)
    assert col["kv.watermark"] == pytest.approx([54] * 30)
    assert col["a2a.total"] == [384] * 30 and col["a2a.gather"] == [128] * 30
    assert col["a2a.measured"] == [0] * 30
    assert col["rank.imbalance"] == pytest.approx([1.25] * 30)
    assert col["blocks.mean"] == pytest.approx([(1 + 2 + 1) / 3] * 30)  # ctx 16, 20, 9
    assert col["blocks.max"] == [2] * 30
    assert col["queue.preempted"] == [float(i % 5 == 0) for i in range(30)]
    assert got["imbalance"] == [[2.0, 1.0]] * 30
    assert col["ttft.p50"][-1] == pytest.approx(np.percentile(range(30), 50))
    assert col["tok_s"][-1] == pytest.approx(1800)  # 18 tokens a step, 0.01 s apart
    assert got["expertSteps"] == 30 and got["expertSum"][0] == [180, 60, 60, 60]
    assert got["latest"] == 29
    assert got["markers"] == [[10, "v2: max_num_seqs 8→4", None]]


def test_a_bounded_window_keeps_the_newest_steps_and_their_markers(page: Page) -> None:
    steps = [frame(i, {"max_num_seqs": [8, i]} if i in (50, 90) else None) for i in range(100)]
    got = js_view(page, steps, maxlen=20)
    assert got["columns"]["step"] == list(range(80, 100))
    assert got["markers"] == [[90, "v2: max_num_seqs 8→90", None]]
    last = js_view(page, steps, maxlen=20, last=5)
    assert last["columns"]["step"] == list(range(95, 100)) and last["markers"] == []
    assert last["columns"]["ttft.p50"][-1] == pytest.approx(np.percentile(range(36, 100), 50))


def test_requests_keep_their_colour_while_they_run(page: Page) -> None:
    slots = js_view(page, frames(12))["slots"]
    a_colour = slots[0]["colours"][1]
    assert all(column["colours"][1] == a_colour for column in slots)  # request "a"
    assert slots[0]["colours"][2] != a_colour  # request "b"
    prefill_colours = {column["colours"][0] for column in slots}
    assert prefill_colours <= set(range(10)) and len(prefill_colours) == 10
    assert slots[3]["texts"][1] == "a decode 1 tok, ctx 20"
    assert slots[3]["prefill"] == [0]


def test_old_frames_and_an_empty_window(page: Page) -> None:
    got = js_view(page, [old_frame(i) for i in range(4)])
    assert all(math.isnan(x) for x in got["columns"]["rank.imbalance"])
    assert got["columns"]["kv.watermark"] == [60] * 4  # usable: no watermark known
    empty = js_view(page, [])
    assert empty["length"] == 0 and empty["latest"] is None and empty["markers"] == []


def test_knob_labels_read_as_the_servers(page: Page) -> None:
    label = run(
        page,
        "(m, changes) => m.knobLabel(changes)",
        {"max_num_seqs": [8, 4], "policy": ["fcfs", "priority"], "kv_capacity_blocks": [None, 9]},
    )
    assert label == "max_num_seqs 8→4, policy fcfs→priority, kv_capacity_blocks None→9"


FEED = """(m, messages) => {
    const feed = new m.Feed(new m.StepWindow(100));
    messages.forEach((text) => feed.read(text));
    const v = feed.window.view();
    const marked = feed.marked;
    feed.take();
    return {received: feed.received, dropped: feed.dropped, malformed: feed.malformed,
            error: feed.error, replay: feed.replay, steps: v.steps, marked,
            taken: feed.marked || feed.changed};
}"""


def _text(msg: Any) -> str:
    return json.dumps(msg)


def test_the_feed_skips_and_counts_what_it_cannot_read(page: Page) -> None:
    broken = frame(3)
    del broken["batch"]
    bad_latency = frame(4)
    bad_latency["latency"]["ttft_ms"] = ["slow"]
    messages = [
        _text(frame(0)),
        "{not json",
        _text([frame(1), {**frame(2), "dropped": 5}, broken, bad_latency, 7]),
        _text({"error": "every: must be in [1, 100000], got 0"}),
        _text({"replay": {"state": "paused", "speed": 1.0, "next": 6}}),
        _text(frame(5, {"max_num_seqs": [8, 4]})),
    ]
    got = run(page, FEED, messages)
    assert got["steps"] == [0, 1, 2, 5]  # never a broken step in the charts
    assert (got["received"], got["dropped"], got["malformed"]) == (4, 5, 4)
    assert got["error"] == "every: must be in [1, 100000], got 0"
    assert got["replay"]["state"] == "paused"
    assert got["marked"] and not got["taken"]  # a knob change is news until taken
