"""The autopilot on the Live page: its SLO chart and decision rows from a status, and the
sidebar's switch and targets reaching a real server."""

from pathlib import Path
from typing import Any

import httpx
import pytest
from api_servers import TIMEOUT, Served
from streamlit.testing.v1 import AppTest

from dashboard.autopilot_view import decision_rows, slo_figure

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")

STATUS: dict[str, Any] = {
    "settings": {"enabled": True, "ttft_p90_ms": 800.0, "tpot_p90_ms": 60.0},
    "state": "adjusting",
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


def test_the_slo_chart_draws_measurements_against_dashed_targets() -> None:
    fig = slo_figure(STATUS)
    ttft, tpot, attainment = fig.data
    assert list(ttft.x) == [0.0, 2.0] and list(ttft.y) == [1900.0, 600.0]
    assert list(tpot.y) == [40.0, 45.0] and attainment.yaxis == "y2"
    targets = sorted((s.y0, s.line.dash) for s in fig.layout.shapes)
    assert targets == [(60.0, "dash"), (800.0, "dash")]


def test_decisions_read_newest_first_with_refusals_named() -> None:
    rows = decision_rows(STATUS)
    assert rows[0] == {
        "action": "change (refused)",
        "version": "5",
        "change": "max_num_seqs 32→16",
        "why": "below a live request's need",
    }
    assert rows[1]["why"] == "p90 TTFT 1.9 s > 800 ms target"


@pytest.mark.slow
def test_the_switch_and_targets_reach_the_server(served: Served) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    at.run()
    assert not at.exception
    at.toggle(key="autopilot_enabled").set_value(True)
    at.number_input(key="autopilot_ttft").set_value(750.0)
    at.button(key="autopilot_set").click().run()
    assert not at.exception
    status = httpx.get(served.url + "/api/autopilot", timeout=TIMEOUT).json()
    assert status["settings"]["enabled"] is True and status["settings"]["ttft_p90_ms"] == 750.0
    assert any(s.value.startswith("autopilot on") for s in at.success)
    at.toggle(key="autopilot_enabled").set_value(False)
    at.button(key="autopilot_set").click().run()
    status = httpx.get(served.url + "/api/autopilot", timeout=TIMEOUT).json()
    assert status["settings"]["enabled"] is False and status["state"] == "off"
