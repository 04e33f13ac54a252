"""The twin's tables on the dashboard: deltas marked better or worse by each metric's sense,
medians with their bands and the saturation in words, and the band drawn in the browser."""

from pathlib import Path

import pytest
from browser import CHROMIUM
from js_modules import ORIGIN, js_page
from playwright.sync_api import expect

from dashboard.whatif_view import (
    band_rows,
    delta_text,
    preview_caption,
    preview_rows,
    saturation_lines,
    scorecard_rows,
)

ANSWER = {
    "current": {"throughput_tok_s": 200.0, "ttft_p90_ms": 800.0, "tpot_p50_ms": None},
    "candidate": {"throughput_tok_s": 250.0, "ttft_p90_ms": 1200.0, "tpot_p50_ms": 20.0},
    "fit": {"mape": 0.08, "steps": 400},
}


def test_deltas_know_which_way_is_better() -> None:
    assert delta_text(200.0, 250.0, lower_is_better=False) == "+25% ▲"
    assert delta_text(800.0, 1200.0, lower_is_better=True) == "+50% ▼"
    assert delta_text(800.0, 400.0, lower_is_better=True) == "-50% ▲"
    assert delta_text(10.0, 10.01, lower_is_better=True) == "+0%"
    assert delta_text(None, 3.0, lower_is_better=True) == "–"
    assert delta_text(0.0, 0.0, lower_is_better=True) == "0"


def test_preview_rows_show_both_sides() -> None:
    rows = {r["metric"]: r for r in preview_rows(ANSWER)}
    assert rows["throughput tok/s"] == {
        "metric": "throughput tok/s",
        "now": "200",
        "with the change": "250",
        "change": "+25% ▲",
    }
    assert rows["TTFT p90 ms"]["change"] == "+50% ▼"
    assert rows["TPOT p50 ms"]["now"] == "–" and rows["TPOT p50 ms"]["change"] == "–"
    assert rows["preemptions"]["now"] == "–"  # absent from the answer


def test_scorecard_rows_give_the_error_of_each_prediction() -> None:
    entry = {
        "version": 3,
        "origin": "dashboard",
        "changes": {"max_num_seqs": [64, 8]},
        "horizon_s": 60,
        "predicted": {
            "candidate": {"ttft_p90_ms": 110.0, "tpot_p90_ms": 20.0, "throughput_tok_s": 90.0}
        },
        "observed": {"ttft_p90_ms": 100.0, "tpot_p90_ms": 25.0, "throughput_tok_s": None},
        "errors": {
            "ttft_p90_ms": {"relative": 0.1},
            "tpot_p90_ms": {"relative": -0.2},
            "throughput_tok_s": {"relative": None},
        },
    }
    (row,) = scorecard_rows([entry])
    assert row["TTFT p90"] == "110 / 100 (+10%)"
    assert row["TPOT p90"] == "20 / 25 (-20%)"
    assert row["tok/s"] == "90 / – (–)"
    assert (row["version"], row["origin"], row["change"]) == ("3", "dashboard", "max_num_seqs 64→8")
    assert row["state"] == "observed"
    waiting = {**entry, "observed": None, "errors": None}
    assert scorecard_rows([waiting])[0]["state"] == "observing for 60 s"
    refused = {"version": 4, "predicted": None, "reason": "no prediction: too few steps"}
    assert scorecard_rows([refused])[0]["state"] == "no prediction: too few steps"


ANSWER_BANDED = {
    "current": {
        "ttft_p90_ms": 800.0,
        "tpot_p50_ms": 20.0,
        "bands": {"ttft_p90_ms": [600.0, 1000.0], "tpot_p50_ms": [18.0, 25.0]},
        "saturation": {
            "builds": 0,
            "draws": 10,
            "text": "the queue stays bounded in all 10 simulations",
        },
    },
    "candidate": {
        "ttft_p90_ms": 1200.0,
        "tpot_p50_ms": 15.0,
        "bands": {"ttft_p90_ms": [700.0, 4000.0], "tpot_p50_ms": [14.0, 16.0]},
        "saturation": {
            "builds": 4,
            "draws": 10,
            "text": "within the noise of saturation: the queue builds in 4 of 10 simulations",
        },
    },
    "fit": {"mape": 0.08, "steps": 400},
    "draws": 10,
}


def test_preview_rows_give_the_median_and_its_band() -> None:
    rows = {r["metric"]: r for r in preview_rows(ANSWER_BANDED)}
    assert rows["TTFT p90 ms"]["now"] == "800 [600 – 1,000]"
    assert rows["TTFT p90 ms"]["with the change"] == "1,200 [700 – 4,000]"
    assert rows["TTFT p90 ms"]["change"] == "+50% ▼"  # of the medians
    assert rows["throughput tok/s"]["now"] == "–"  # no value, no band
    assert saturation_lines(ANSWER_BANDED) == [
        "now: the queue stays bounded in all 10 simulations",
        "with the change: within the noise of saturation: the queue builds in 4 of 10 simulations",
    ]
    assert "10 simulations a side" in preview_caption(ANSWER_BANDED)
    bands = {r["metric"]: r for r in band_rows(ANSWER_BANDED)}
    assert bands["ttft_p90_ms"]["now"] == [800.0, 600.0, 1000.0]
    assert bands["ttft_p90_ms"]["then"] == [1200.0, 700.0, 4000.0]
    assert bands["throughput_tok_s"]["now"] == [None, None, None]


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_the_browser_draws_each_band_around_its_median() -> None:
    """bands.js's figure: a point per metric and side at its median over the median now, an
    error bar from the band's low to its high; plotly.js draws both sides' bars."""
    rows = band_rows(ANSWER_BANDED)
    with js_page() as page:
        fig = page.evaluate("async (rows) => (await import('/bands.js')).bandFigure(rows)", rows)
        now, then = fig["data"]
        assert now["x"] == then["x"] == ["TTFT p90 ms", "TPOT p50 ms"]  # those with a median
        assert now["y"] == [1.0, 1.0]
        assert then["y"] == pytest.approx([1.5, 0.75])
        # TTFT p90 with the change: 1200 within [700, 4000], over 800 now
        assert then["error_y"]["array"][0] == pytest.approx((4000 - 1200) / 800)
        assert then["error_y"]["arrayminus"][0] == pytest.approx((1200 - 700) / 800)
        assert now["error_y"]["arrayminus"][1] == pytest.approx((20 - 18) / 20)
        page.add_script_tag(url=f"{ORIGIN}/plotly.min.js")
        page.evaluate(
            """async (rows) => {
                const div = document.createElement("div");
                document.body.append(div);
                (await import('/bands.js')).drawBands(div, rows);
            }""",
            rows,
        )
        expect(page.locator("g.errorbar")).to_have_count(4)
