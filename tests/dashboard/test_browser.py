"""End to end: a real server, `python -m dashboard` (streamlit run) and headless Chromium.
The charts are the live-charts component's, drawn in the browser from the websocket (Live,
Replay) or from a recorded session's steps read over HTTP (Compare)."""

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_servers import Served, traffic, wait_idle
from browser import (
    CHROMIUM,
    COMPONENT,
    VIEWPORT,
    WAIT_MS,
    charts,
    chromium,
    dashboard,
    drawn_step,
    wait_drawn_past,
)
from playwright.sync_api import Frame, expect

from dashboard.client import get_knobs, get_steps, list_sessions
from dashboard.compare_page import CHARTS, MAX_CHART_STEPS, default_pair
from server.state import state_of

PANELS = (
    "batch",
    "usage",
    "kv",
    "queues",
    "kv_blocks",
    "experts",
    "imbalance",
    "a2a",
    "a2a_volume",
    "ranks",
    "latency",
    "throughput",
    "step_time",
)
# charts the server drew (not the sidebar's): none, the panels and reports are the component's
SERVER_CHARTS = '[data-testid="stMain"] .js-plotly-plot'
SIDEBAR_CHARTS = '[data-testid="stSidebar"] .js-plotly-plot'

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


@pytest.fixture
def dashboard_url(served: Served, tmp_path: Path) -> Iterator[str]:
    with dashboard(served.url, tmp_path / "streamlit.log") as url:
        yield url


class Load:
    """Requests keep arriving until `stop`, which then waits for the engine to go idle: four at
    a time, the next four once those have finished (however slow the engine is, nothing piles
    up for `stop` to wait on)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            traffic(self.served.loop, 4, 64)
            wait_idle(self.served.loop)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        wait_idle(self.served.loop)


@pytest.fixture
def load(served: Served) -> Iterator[Load]:
    running = Load(served)
    yield running
    running.stop()


def _state(frame: Frame) -> str:
    return frame.locator("#status .state").inner_text()


def test_live_page_in_a_browser(
    served: Served, dashboard_url: str, load: Load, tmp_path: Path
) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dashboard_url)
        frame = charts(page)
        expect(frame.locator("#status .state")).to_have_text("connected", timeout=WAIT_MS)
        for name in PANELS:
            expect(frame.locator(f'[data-panel="{name}"] .main-svg').first).to_be_attached(
                timeout=WAIT_MS
            )
        for title in (
            "KV blocks per running request",
            "All-to-all volume per step (modeled)",
            "Expert-parallel rank load (placement v",
        ):
            expect(frame.get_by_text(title).first).to_be_visible(timeout=WAIT_MS)
        for panel in ("batch", "throughput"):  # the charts move on as steps arrive
            wait_drawn_past(frame, drawn_step(frame, panel), panel)
        why = frame.locator('[data-report="why_slow"]')
        expect(why.get_by_text("requests ended in the last 60 s")).to_be_visible(timeout=WAIT_MS)
        expect(why.locator('[data-chart="waterfall"] .main-svg').first).to_be_attached(
            timeout=WAIT_MS
        )
        pilot = frame.locator('[data-report="autopilot"]')
        expect(pilot.get_by_text("off: –")).to_be_visible(timeout=WAIT_MS)
        page.get_by_text("hold the targets").click()
        page.get_by_role("button", name="Set", exact=True).click()
        expect(page.get_by_text("autopilot on")).to_be_visible(timeout=WAIT_MS)
        expect(pilot.get_by_text("off: –")).to_have_count(0, timeout=WAIT_MS)
        page.get_by_text("hold the targets").click()
        page.get_by_role("button", name="Set", exact=True).click()
        expect(pilot.get_by_text("off: –")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator(SIDEBAR_CHARTS)).to_have_count(1, timeout=WAIT_MS)  # placement
        expect(page.locator(SERVER_CHARTS)).to_have_count(0)
        page.screenshot(path=tmp_path / "live.png", full_page=True)
        # From here on a page that holds still: a knob change's marker stays in the charts
        # until the steps shown move past it (how soon depends on the engine's speed).
        load.stop()

        state = get_knobs(served.url)
        old = state["knobs"]["max_num_seqs"]
        new = 5 if old != 5 else 7
        page.get_by_role("spinbutton", name="max_num_seqs").fill(str(new))
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text("accepted as version")).to_be_visible(timeout=WAIT_MS)
        assert get_knobs(served.url)["knobs"]["max_num_seqs"] == new
        expect(frame.get_by_text(f"max_num_seqs {old}→{new}").first).to_be_visible(timeout=WAIT_MS)
        expect(frame.get_by_text(f"knobs version {state['version'] + 1}")).to_be_visible()

        page.get_by_role("spinbutton", name="max_num_batched_tokens").fill("3")
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text(f"must be at least max_num_seqs ({new})")).to_be_visible(
            timeout=WAIT_MS
        )
        assert get_knobs(served.url)["knobs"]["max_num_batched_tokens"] != 3

        traffic(served.loop, 4, 24)  # a few steps either side of the rebalance
        wait_idle(served.loop)
        version = httpx.get(served.url + "/api/experts").json()["version"]
        page.get_by_role("button", name="Rebalance experts").click()
        expect(page.get_by_text(f"placement v{version + 1}: predicted imbalance")).to_be_visible(
            timeout=WAIT_MS
        )
        assert httpx.get(served.url + "/api/experts").json()["version"] == version + 1
        traffic(served.loop, 4, 24)
        wait_idle(served.loop)
        expect(frame.get_by_text(f"expert_placement {version}→{version + 1}").first).to_be_visible(
            timeout=WAIT_MS
        )
        expect(frame.get_by_text(f"(placement v{version + 1})")).to_be_visible(timeout=WAIT_MS)
        page.screenshot(path=tmp_path / "rebalance.png", full_page=True)
        print(f"screenshots in {tmp_path}")


FIRST_DRAWN = "() => document.querySelector('[data-panel=\"batch\"]').data[0].x[0] ?? null"


def test_replay_controls_move_the_replay(served: Served, dashboard_url: str) -> None:
    traffic(served.loop, 4, 32)
    wait_idle(served.loop)
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dashboard_url + "/replay")
        page.locator('[data-testid="stSelectbox"]').filter(has_text="speed").click()
        page.get_by_role("option", name="as fast as possible").click()
        page.get_by_role("button", name="Play").click()
        frame = charts(page)
        expect(frame.get_by_text("replay ended")).to_be_visible(timeout=WAIT_MS)
        wait_drawn_past(frame, 10)
        assert _state(frame) == "connected"
        why = frame.locator('[data-report="why_slow"]')
        expect(why.get_by_text("requests in the session")).to_be_visible(timeout=WAIT_MS)

        # paused, a seek empties the charts and nothing comes: the answer to a later op
        # would follow any step sent before it
        frame.get_by_role("button", name="Pause").click()
        frame.get_by_label("seek to step").fill("10")
        frame.get_by_role("button", name="Seek").click()
        expect(frame.get_by_text("replay paused")).to_be_visible(timeout=WAIT_MS)
        frame.get_by_label("speed").select_option(label="0.5x")
        # the status line's, once the server answered (the speed control's label holds the
        # same words)
        expect(frame.locator("#status").get_by_text("speed 0.5x", exact=True)).to_be_visible(
            timeout=WAIT_MS
        )
        expect(frame.get_by_text("step –")).to_be_visible()
        frame.wait_for_function(f"() => ({FIRST_DRAWN})() === null", timeout=WAIT_MS)

        frame.get_by_role("button", name="Resume").click()
        wait_drawn_past(frame, 10)
        assert frame.evaluate(FIRST_DRAWN) == 10  # played on from the step sought
        frame.get_by_label("speed").select_option(label="as fast as possible")
        expect(frame.get_by_text("replay ended")).to_be_visible(timeout=WAIT_MS)


# per session's column of the component's frame, per panel: the points of each of its traces
POINTS = """() => [...document.querySelectorAll('.source')].map((column) => Object.fromEntries(
    [...column.querySelectorAll('[data-panel]')]
        .map((d) => [d.dataset.panel, (d.data || []).map((t) => t.x.length)])))"""


def test_compare_draws_each_sessions_recorded_steps_in_the_component(
    served: Served, dashboard_url: str
) -> None:
    """The component reads each session's first steps from the server and draws the Compare
    page's panels in a column a session, every trace a point a step; the server draws no
    chart."""
    traffic(served.loop, 4, 32)
    wait_idle(served.loop)
    assert state_of(served.server.server.config.app).recorder.flush()
    sessions = list_sessions(served.url)
    ids = [sessions[i]["id"] for i in default_pair(sessions)]
    want = [len(get_steps(served.url, i, max_steps=MAX_CHART_STEPS)) for i in ids]
    assert all(want)
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dashboard_url + "/compare")
        handle = page.wait_for_selector(COMPONENT, timeout=WAIT_MS)
        frame = handle and handle.content_frame()
        assert frame is not None
        columns = frame.locator(".source")
        expect(columns).to_have_count(2, timeout=WAIT_MS)
        for i, (side, session, steps) in enumerate(zip("AB", ids, want, strict=True)):
            column = columns.nth(i)
            expect(column.locator(".title")).to_have_text(f"{side}: {session}")
            expect(column.locator(".status .state")).to_have_text("loaded", timeout=WAIT_MS)
            expect(column.get_by_text(f"steps received {steps}")).to_be_visible()
        drawn = " && ".join(
            f"Object.values(c[{i}]).every((n) => n.length && n.every((x) => x === {steps}))"
            for i, steps in enumerate(want)
        )
        frame.wait_for_function(
            f"() => {{ const c = ({POINTS})(); return {drawn}; }}", timeout=WAIT_MS
        )
        assert [list(column) for column in frame.evaluate(POINTS)] == [list(CHARTS)] * 2
        expect(page.locator(COMPONENT)).to_have_count(1)
        expect(page.locator(SERVER_CHARTS)).to_have_count(0)
