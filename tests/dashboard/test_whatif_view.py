"""The twin's tables on the dashboard: deltas marked better or worse by each metric's sense."""

from dashboard.whatif_view import delta_text, preview_rows, scorecard_rows

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
