"""The reports below the live charts, in JavaScript: the "Why slow?" figures on a sample
attribution report, the autopilot's chart and decisions on a sample status, and a report
read from routes that answer, refuse, change or stay silent."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attribution_report import CAUSES, T, report
from browser import CHROMIUM, chromium
from js_modules import ORIGIN, blank_page, run
from playwright.sync_api import Browser, Page, Route

from engine.ep.ranks import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]

Figure = dict[str, Any]
STATUS: dict[str, Any] = {
    "settings": {"enabled": True, "ttft_p90_ms": 800.0, "tpot_p90_ms": 60.0},
    "state": "adjusting",
    "note": "p90 TTFT 1.9 s > 0.8 s target",
    "history": [
        {"t": 100.0, "requests": 9, "ttft_p90_ms": 1900.0, "tpot_p90_ms": 40.0, "attainment": 0.4},
        {"t": 102.0, "requests": 9, "ttft_p90_ms": 600.0, "tpot_p90_ms": 45.0, "attainment": 0.9},
    ],
    "decisions": [
        {
            "action": "change",
            "version": 5,
            "changes": {"max_num_seqs": [32, 16]},
            "reason": "p90 TPOT 80 ms > 60 ms target",
            "refused": "below a live request's need",
        },
        {
            "action": "change",
            "version": 4,
            "changes": {"max_num_seqs": [16, 32]},
            "reason": "p90 TTFT 1.9 s > 800 ms target",
            "refused": None,
        },
    ],
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def page(browser: Browser) -> Page:
    return blank_page(browser)


def _colours(page: Page) -> dict[str, str]:
    return run(page, "(m) => m.CAUSE_COLOURS")


def _bars(page: Page, r: dict[str, Any], metric: str) -> Figure:
    return run(page, "(m, [r, metric]) => m.causeBars(r, metric)", [r, metric])


def _waterfall(page: Page, r: dict[str, Any]) -> Figure:
    return run(page, "(m, r) => m.waterfall(r)", r)


def test_headline_names_the_dominant_causes_in_the_servers_words(page: Page) -> None:
    assert run(page, "(m, r) => m.headline(r)", report()) == [
        "62% of p90 TTFT is queueing for a slot: max_num_seqs",
        "90% of p90 TPOT is decode steps",
    ]
    none = {**report(), "dominant": {"ttft": None, "tpot": None}}
    assert run(page, "(m, r) => m.headline(r)", none) == []


@pytest.mark.parametrize("metric", ["ttft", "tpot"])
def test_bars_stack_to_each_buckets_mean(page: Page, metric: str) -> None:
    r = report()
    fig = _bars(page, r, metric)
    assert fig["layout"]["barmode"] == "stack"
    for i, bucket in enumerate(r["over_time"]):
        stacked = sum(bar["y"][i] for bar in fig["data"])
        assert stacked == pytest.approx(sum(bucket[metric].values()))
    # seconds after the earliest thing shown (the first bucket), a bar per 5 s bucket
    first = fig["data"][0]
    assert first["x"] == [2.5, 7.5] and first["width"] == [5.0, 5.0]
    assert first["customdata"] == [2, 1]


def test_each_cause_has_its_fixed_colour_and_its_servers_words(page: Page) -> None:
    colours, unknown = _colours(page), run(page, "(m) => m.UNKNOWN")
    fig = _bars(page, report(), "ttft")
    names = {bar["name"]: bar["marker"]["color"] for bar in fig["data"]}
    assert names == {
        CAUSES["queue_slots"]: colours["queue_slots"],
        CAUSES["prefill"]: colours["prefill"],
        CAUSES["overhead"]: colours["overhead"],
        "mystery": unknown,  # a cause the server added later: its name, a neutral colour
    }
    assert fig["data"][-1]["name"] == "mystery"  # the fixed order, unknown last
    assert len(set(colours.values())) == len(colours)


def test_stacking_order_is_fixed(page: Page) -> None:
    causes = ["decode", "zz", "queue_slots", "aa"]
    order = run(page, "(m, c) => m.ordered(new Set(c))", causes)
    assert order == ["queue_slots", "decode", "aa", "zz"]


def test_the_causes_are_the_servers(page: Page) -> None:
    from tuning.attribution.causes import CAUSES as SERVER_CAUSES

    assert set(_colours(page)) == set(SERVER_CAUSES)


def test_waterfall_draws_each_request_over_its_life_by_phase(page: Page) -> None:
    fig = _waterfall(page, report())
    assert fig["layout"]["barmode"] == "overlay"
    assert fig["layout"]["yaxis"]["categoryarray"] == ["early", "slow"]  # by arrival
    spans: dict[str, list[tuple[float, float]]] = {}
    for bar in fig["data"]:
        assert bar["orientation"] == "h"
        assert bar["customdata"] == bar["x"]  # the hover's duration, not the bar's end
        for req, base, length in zip(bar["y"], bar["base"], bar["x"], strict=True):
            spans.setdefault(req, []).append((base, base + length))
    # the origin is the first bucket's start; bars tile arrival..end without gaps
    for req, (arrival, end) in {"early": (0.5, 3.0), "slow": (1.0, 2.0)}.items():
        pieces = sorted(spans[req])
        assert pieces[0][0] == pytest.approx(arrival) and pieces[-1][1] == pytest.approx(end)
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(pieces, pieces[1:], strict=False))


def test_waterfall_colours_a_wait_by_its_cause_and_other_phases_by_phase(page: Page) -> None:
    colours = _colours(page)
    fig = _waterfall(page, report())
    assert {bar["name"]: bar["marker"]["color"] for bar in fig["data"]} == {
        CAUSES["queue_busy"]: colours["queue_busy"],
        "prefill": colours["prefill"],
        "decode": colours["decode"],
        "preempted": colours["preemption"],
        CAUSES["queue_slots"]: colours["queue_slots"],
    }
    assert run(page, "(m) => m.phaseColour('waiting', null) === m.UNKNOWN")


def test_waterfall_hover_holds_the_requests_breakdown(page: Page) -> None:
    fig = _waterfall(page, report())
    hovers = {
        req: text
        for bar in fig["data"]
        for req, text in zip(bar["y"], bar["hovertext"], strict=True)
    }
    assert hovers["slow"].split("<br>") == [
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


def test_an_empty_report_still_builds(page: Page) -> None:
    empty = {**report(), "requests": 0, "over_time": [], "recent": [], "from": T}
    for fig in (_bars(page, empty, "ttft"), _bars(page, empty, "tpot"), _waterfall(page, empty)):
        assert fig["layout"]["title"]["text"] and not fig["data"]


def test_a_decodes_steps_and_the_overhead_between_them_are_one_bar(page: Page) -> None:
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
    assert run(page, "(m, p) => m.runs(p)", phases) == [
        ["waiting", "queue_slots", 0.0, 0.1],
        ["waiting", "overhead", 0.1, 0.2],
        ["prefill", None, 0.2, 0.5],
        ["decode", None, 0.5, pytest.approx(1.0)],
        ["decode", None, 1.2, 1.3],
    ]


def test_the_slo_chart_draws_measurements_against_dashed_targets(page: Page) -> None:
    fig = run(page, "(m, s) => m.sloFigure(s)", STATUS)
    ttft, tpot, attainment = fig["data"]
    assert ttft["x"] == [0.0, 2.0] and ttft["y"] == [1900.0, 600.0]
    assert tpot["y"] == [40.0, 45.0] and attainment["yaxis"] == "y2"
    targets = sorted((s["y0"], s["line"]["dash"]) for s in fig["layout"]["shapes"])
    assert targets == [(60.0, "dash"), (800.0, "dash")]
    assert fig["layout"]["yaxis"]["type"] == "log"


def test_decisions_read_newest_first_with_refusals_named(page: Page) -> None:
    rows = run(page, "(m, s) => m.decisionRows(s)", STATUS)
    assert rows[0] == {
        "action": "change (refused)",
        "version": "5",
        "change": "max_num_seqs 32→16",
        "why": "below a live request's need",
    }
    assert rows[1]["why"] == "p90 TTFT 1.9 s > 800 ms target"
    assert (
        run(page, "(m, s) => m.stateLine(s)", STATUS) == "adjusting: p90 TTFT 1.9 s > 0.8 s target"
    )


# --- a report read from routes -------------------------------------------------------------

START = """(m, [specs, token]) => {
    const root = document.createElement("div");
    root.id = "reports";
    document.body.replaceChildren(root);
    window.shown = new m.Reports(root, specs, token);
}"""


class Routes:
    """Answers for `ORIGIN/api/<name>`: (status, body) by name, and the Authorization header
    of every request."""

    def __init__(self, page: Page) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.auth: list[str | None] = []
        page.route(f"{ORIGIN}/api/**", self._answer)

    def _answer(self, route: Route) -> None:
        self.auth.append(route.request.headers.get("authorization"))
        name = route.request.url.removeprefix(f"{ORIGIN}/api/").split("?")[0]
        status, body = self.answers[name]
        route.fulfill(status=status, body=json.dumps(body), content_type="application/json")


@pytest.fixture
def routed(browser: Browser) -> Iterator[tuple[Page, Routes]]:
    p = blank_page(browser)
    p.add_script_tag(url=f"{ORIGIN}/plotly.min.js")
    yield p, Routes(p)
    p.close()


def _spec(name: str, every_s: float, url: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "title": name,
        "url": url or f"{ORIGIN}/api/{name}",
        "every_s": every_s,
        "scope": "in the test",
    }


def _section(page: Page, name: str) -> str:
    return f'[data-report="{name}"]'


def _answers(page: Page, name: str) -> int:
    return int(page.get_attribute(_section(page, name), "data-answers") or 0)


def _draws(page: Page, name: str, chart: str) -> int:
    selector = f'{_section(page, name)} [data-chart="{chart}"]'
    return int(page.get_attribute(selector, "data-draws") or 0)


def _wait_answers(page: Page, name: str, more_than: int) -> None:
    page.wait_for_function(
        f"() => Number(document.querySelector('{_section(page, name)}').dataset.answers) > "
        f"{more_than}"
    )


def test_a_report_is_drawn_with_the_key_and_redrawn_only_when_it_changes(
    routed: tuple[Page, Routes],
) -> None:
    page, routes = routed
    routes.answers = {"why_slow": (200, report()), "autopilot": (200, STATUS)}
    run(page, START, [[_spec("why_slow", 0.05), _spec("autopilot", 0.05)], "sk-key"])
    section = page.locator(_section(page, "why_slow"))
    section.get_by_text("3 requests in the test").wait_for()
    section.get_by_text("62% of p90 TTFT is queueing for a slot: max_num_seqs").wait_for()
    page.locator(_section(page, "autopilot")).get_by_text("change (refused)").wait_for()
    page.get_by_text("adjusting: p90 TTFT 1.9 s > 0.8 s target").wait_for()
    assert set(routes.auth) == {"Bearer sk-key"}
    for chart in ("ttft", "tpot", "waterfall"):
        assert _draws(page, "why_slow", chart) == 1
    _wait_answers(page, "why_slow", _answers(page, "why_slow") + 2)
    assert _draws(page, "why_slow", "waterfall") == 1  # the same answer is not drawn again
    routes.answers["why_slow"] = (200, {**report(), "requests": 4})
    section.get_by_text("4 requests in the test").wait_for()
    assert _draws(page, "why_slow", "waterfall") == 2
    off = {**STATUS, "settings": {**STATUS["settings"], "enabled": False}, "state": "off"}
    routes.answers["autopilot"] = (200, {**off, "note": ""})
    page.get_by_text("off: –").wait_for()
    assert page.locator(f'{_section(page, "autopilot")} [data-chart="slo"]').is_hidden()


def test_a_refusal_shows_the_servers_words_and_asking_goes_on(
    routed: tuple[Page, Routes],
) -> None:
    page, routes = routed
    old = "step 0 was recorded with telemetry v1; attribution needs v2 or later"
    error = {"error": {"message": old, "type": "invalid_request_error", "code": 422}}
    routes.answers = {"why_slow": (422, error)}
    run(page, START, [[_spec("why_slow", 0.05)], ""])
    page.get_by_text(f"422: {old}").wait_for()
    assert routes.auth[0] is None  # no key, no header
    assert (
        page.locator('[data-chart="waterfall"]').is_hidden()
        or _draws(page, "why_slow", "waterfall") == 0
    )
    routes.answers["why_slow"] = (200, report())
    page.get_by_text("3 requests in the test").wait_for()
    assert page.get_by_text(f"422: {old}").count() == 0


def test_an_unreachable_server_is_named_and_a_malformed_answer_is_shown(
    routed: tuple[Page, Routes],
) -> None:
    page, routes = routed
    routes.answers = {"why_slow": (200, {"requests": 3})}  # no buckets, no timelines
    nowhere = f"http://127.0.0.1:{free_port()}/api/attribution"
    run(page, START, [[_spec("why_slow", 0.05), _spec("autopilot", 0.05, nowhere)], ""])
    page.get_by_text("cannot draw the server's answer").wait_for()
    page.get_by_text(f"server unreachable ({nowhere})").wait_for()
