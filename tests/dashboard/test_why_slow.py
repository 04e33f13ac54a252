"""The "Why slow?" figures on a sample attribution report: stacked bars that add up to each
bucket's mean, one colour per cause, and a waterfall whose hover holds the breakdown."""

import pytest
from attribution_report import CAUSES, T, report

from dashboard import why_slow
from dashboard.causes import COLOURS, UNKNOWN, ordered, phase_colour


def test_headline_names_the_dominant_causes_in_the_servers_words() -> None:
    assert why_slow.headline(report()) == [
        "62% of p90 TTFT is queueing for a slot: max_num_seqs",
        "90% of p90 TPOT is decode steps",
    ]
    assert why_slow.headline({**report(), "dominant": {"ttft": None, "tpot": None}}) == []


@pytest.mark.parametrize("metric", ["ttft", "tpot"])
def test_bars_stack_to_each_buckets_mean(metric: str) -> None:
    r = report()
    fig = why_slow.cause_bars(r, metric)
    assert fig.layout.barmode == "stack"
    for i, bucket in enumerate(r["over_time"]):
        stacked = sum(bar.y[i] for bar in fig.data)
        assert stacked == pytest.approx(sum(bucket[metric].values()))
    # seconds after the earliest thing shown (the first bucket), a bar per 5 s bucket
    assert list(fig.data[0].x) == [2.5, 7.5] and list(fig.data[0].width) == [5.0, 5.0]
    assert list(fig.data[0].customdata) == [2, 1]


def test_each_cause_has_its_fixed_colour_and_its_servers_words() -> None:
    fig = why_slow.cause_bars(report(), "ttft")
    names = {bar.name: bar.marker.color for bar in fig.data}
    assert names == {
        CAUSES["queue_slots"]: COLOURS["queue_slots"],
        CAUSES["prefill"]: COLOURS["prefill"],
        CAUSES["overhead"]: COLOURS["overhead"],
        "mystery": UNKNOWN,  # a cause the server added later: its name, a neutral colour
    }
    assert [bar.name for bar in fig.data][-1] == "mystery"  # the fixed order, unknown last
    assert len(set(COLOURS.values())) == len(COLOURS)


def test_stacking_order_is_fixed() -> None:
    assert ordered({"decode", "zz", "queue_slots", "aa"}) == ["queue_slots", "decode", "aa", "zz"]


def test_waterfall_draws_each_request_over_its_life_by_phase() -> None:
    fig = why_slow.waterfall(report())
    assert fig.layout.barmode == "overlay"
    assert list(fig.layout.yaxis.categoryarray) == ["early", "slow"]  # by arrival
    spans: dict[str, list[tuple[float, float]]] = {}
    for bar in fig.data:
        assert bar.orientation == "h"
        assert list(bar.customdata) == list(bar.x)  # the hover's duration, not the bar's end
        for req, base, length in zip(bar.y, bar.base, bar.x, strict=True):
            spans.setdefault(req, []).append((base, base + length))
    # the origin is the first bucket's start; bars tile arrival..end without gaps
    for req, (arrival, end) in {"early": (0.5, 3.0), "slow": (1.0, 2.0)}.items():
        pieces = sorted(spans[req])
        assert pieces[0][0] == pytest.approx(arrival) and pieces[-1][1] == pytest.approx(end)
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(pieces, pieces[1:], strict=False))


def test_waterfall_colours_a_wait_by_its_cause_and_other_phases_by_phase() -> None:
    fig = why_slow.waterfall(report())
    colours = {bar.name: bar.marker.color for bar in fig.data}
    assert colours == {
        CAUSES["queue_busy"]: COLOURS["queue_busy"],
        "prefill": COLOURS["prefill"],
        "decode": COLOURS["decode"],
        "preempted": COLOURS["preemption"],
        CAUSES["queue_slots"]: COLOURS["queue_slots"],
    }
    assert phase_colour("waiting", None) == UNKNOWN


def test_waterfall_hover_holds_the_requests_breakdown() -> None:
    fig = why_slow.waterfall(report())
    hovers = {req: text for bar in fig.data for req, text in zip(bar.y, bar.hovertext, strict=True)}
    slow = hovers["slow"].split("<br>")
    assert slow == [
        "<b>slow</b>: E2E 1000.0 ms, 11 tokens",
        "TTFT 112.0 ms",
        "   queueing for a slot: max_num_seqs 80.0 ms",
        "   its own prefill 30.0 ms",
        "   engine work between steps 2.0 ms",
        "TPOT 88.8 ms",
        "   decode steps 80.0 ms",
        "   prefill chunks riding in its decode steps 8.8 ms",
    ]
    assert "   preemption: stalled, or recomputing lost KV 192.0 ms" in hovers["early"]


def test_an_empty_report_still_builds() -> None:
    empty = {**report(), "requests": 0, "over_time": [], "recent": [], "from": T}
    for fig in (
        why_slow.cause_bars(empty, "ttft"),
        why_slow.cause_bars(empty, "tpot"),
        why_slow.waterfall(empty),
    ):
        assert fig.layout.title.text and not fig.data
    assert why_slow.origin(empty) == T


def test_a_decodes_steps_and_the_overhead_between_them_are_one_bar() -> None:
    phases = [
        {"t0": 0.0, "t1": 0.1, "phase": "waiting", "cause": "queue_slots"},
        {"t0": 0.1, "t1": 0.2, "phase": "waiting", "cause": "overhead"},
        {"t0": 0.2, "t1": 0.5, "phase": "prefill", "cause": None},
        *(
            {"t0": 0.5 + i / 10, "t1": 0.6 + i / 10, "phase": "decode", "cause": c}
            for i, c in enumerate([None, "overhead", None, "overhead", None])
        ),
        {"t0": 1.2, "t1": 1.3, "phase": "decode", "cause": None},  # after a gap: its own bar
    ]
    assert why_slow.runs(phases) == [
        (("waiting", "queue_slots"), 0.0, 0.1),
        (("waiting", "overhead"), 0.1, 0.2),
        (("prefill", None), 0.2, 0.5),
        (("decode", None), 0.5, pytest.approx(1.0)),
        (("decode", None), 1.2, 1.3),
    ]
