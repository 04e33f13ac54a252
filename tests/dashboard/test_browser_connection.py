"""The live charts' connection in a browser: no server yet, a server that comes, goes and
comes back, and a server that refuses the dashboard's key (on the websocket and on the
reports' routes)."""

from pathlib import Path

import pytest
from api_servers import MODEL, serve, stop, traffic
from browser import CHROMIUM, VIEWPORT, WAIT_MS, charts, chromium, dashboard, wait_drawn_past
from playwright.sync_api import expect

from engine.ep.ranks import free_port
from server.settings import ServerSettings

# the steps the page has received, over every connection
RECEIVED = """() => Number(
    document.getElementById("status").innerText.match(/steps received (\\d+)/)[1])"""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


def test_no_server_then_a_restart_shows_the_state_and_recovers(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with dashboard(url, tmp_path / "streamlit.log") as dash, chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dash)
        frame = charts(page)
        state = frame.locator("#status .state")
        expect(state).to_have_text("server gone", timeout=WAIT_MS)
        expect(
            frame.get_by_text(f"nothing answers at ws://127.0.0.1:{port}/ws/telemetry")
        ).to_be_visible()
        pilot = frame.locator('[data-report="autopilot"]')
        expect(pilot.get_by_text("server unreachable")).to_be_visible(timeout=WAIT_MS)
        for _ in range(2):  # the server comes up, then restarts
            served = serve(ServerSettings(model_name=MODEL), port=port)
            try:
                expect(state).to_have_text("connected", timeout=WAIT_MS)
                expect(pilot.get_by_text("off: –")).to_be_visible(timeout=WAIT_MS)
                expect(pilot.get_by_text("server unreachable")).to_have_count(0)
                received = frame.evaluate(RECEIVED)
                traffic(served.loop, 2, 16)
                frame.wait_for_function(f"() => ({RECEIVED})() > {received}", timeout=WAIT_MS)
                wait_drawn_past(frame, -1)
            finally:
                stop(served)
            expect(state).to_have_text("reconnecting", timeout=WAIT_MS)


def test_a_wrong_key_shows_the_servers_refusal(tmp_path: Path) -> None:
    served = serve(ServerSettings(model_name=MODEL, api_key="sk-right"))
    env = {"MOESCOPE_API_KEY": "sk-wrong"}
    try:
        with dashboard(served.url, tmp_path / "streamlit.log", env) as dash, chromium() as b:
            page = b.new_page(viewport=VIEWPORT)
            page.goto(dash)
            frame = charts(page)
            expect(frame.locator("#status .state")).to_have_text("refused", timeout=WAIT_MS)
            refusal = "missing or invalid API key (Authorization: Bearer <key>)"
            expect(frame.locator("#status").get_by_text(refusal)).to_be_visible()
            for report in ("why_slow", "autopilot"):  # read over HTTP, refused there too
                section = frame.locator(f'[data-report="{report}"]')
                expect(section.get_by_text(f"401: {refusal}")).to_be_visible(timeout=WAIT_MS)
    finally:
        stop(served)
