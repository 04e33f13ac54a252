"""The autopilot's switch and targets in the Live page's sidebar, reaching a real server (its
state, chart and decisions are a report drawn in the browser: test_js_reports.py)."""

from pathlib import Path

import httpx
import pytest
from api_servers import TIMEOUT, Served
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")


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
