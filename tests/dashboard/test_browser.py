"""End to end: a real server, `python -m dashboard` (streamlit run) and headless Chromium."""

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_servers import Served, traffic, wait_for, wait_idle
from playwright.sync_api import Page, expect, sync_playwright

from dashboard.__main__ import command
from dashboard.charts import PANELS
from dashboard.client import get_knobs
from engine.ep.ranks import free_port

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1600, "height": 3600}  # tall enough that a screenshot shows every panel
# the panels (not the sidebar's, nor the "Why slow?" panel's in its `why_...` container)
MAIN_CHARTS = '[data-testid="stMain"] .js-plotly-plot:not([class*="st-key-why_"] *)'
SIDEBAR_CHARTS = '[data-testid="stSidebar"] .js-plotly-plot'
WAIT_MS = 60_000  # for the page to show something: generous, since only a hang should reach it

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/_stcore/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def dashboard_url(served: Served, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "streamlit.log").open("w")
    proc = subprocess.Popen(command(served.url, port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), what="streamlit to start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


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


DRAWN = """n => {
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
        .filter(e => e.getBoundingClientRect().height > 0);
    return charts.length >= n && charts.every(
        e => e.querySelector('.main-svg') && getComputedStyle(e).opacity === '1');
}"""


def _screenshot(page: Page, path: Path) -> None:
    """A screenshot, taken once every chart is drawn and none is faded as stale. Streamlit
    remounts each chart whose figure changed on every refresh, and a slow headless browser may
    still be drawing some when the next refresh comes: up to a few tries for one where all
    were drawn before and after the shot."""
    for _ in range(5):
        page.wait_for_function(DRAWN, arg=len(PANELS), timeout=WAIT_MS)
        page.screenshot(path=path, full_page=True)
        if page.evaluate(DRAWN, len(PANELS)):
            return


def _step(page: Page) -> int:
    text = (
        page.locator('[data-testid="stMetric"]')
        .nth(1)
        .locator('[data-testid="stMetricValue"]')
        .inner_text()
    )
    return int(text) if text.isdigit() else -1


def test_live_page_in_a_browser(
    served: Served, dashboard_url: str, load: Load, tmp_path: Path
) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dashboard_url)
        expect(page.locator(MAIN_CHARTS)).to_have_count(len(PANELS), timeout=WAIT_MS)
        expect(page.locator(SIDEBAR_CHARTS)).to_have_count(1, timeout=WAIT_MS)  # placement
        expect(page.get_by_text("connected", exact=True)).to_be_visible(timeout=WAIT_MS)
        for title in (
            "KV blocks per running request",
            "All-to-all volume per step (modeled)",
            "Expert-parallel rank load (placement v",
        ):
            expect(page.get_by_text(title).first).to_be_visible(timeout=WAIT_MS)
        first = _step(page)
        wait_for(lambda: _step(page) > first, what="the page to show a later step")
        _screenshot(page, tmp_path / "live.png")
        # From here on a page that holds still: a knob change's marker stays in the charts
        # until the steps shown move past it (how soon depends on the engine's speed).
        load.stop()

        old = get_knobs(served.url)["knobs"]["max_num_seqs"]
        new = 5 if old != 5 else 7
        page.get_by_role("spinbutton", name="max_num_seqs").fill(str(new))
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text("accepted as version")).to_be_visible(timeout=WAIT_MS)
        assert get_knobs(served.url)["knobs"]["max_num_seqs"] == new
        expect(page.get_by_text(f"max_num_seqs {old}→{new}").first).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_text("accepted as version")).to_be_visible()  # not overwritten
        expect(page.get_by_text("nothing changed")).to_have_count(0)

        page.get_by_role("spinbutton", name="max_num_batched_tokens").fill("3")
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text(f"must be at least max_num_seqs ({new})")).to_be_visible(
            timeout=WAIT_MS
        )
        assert get_knobs(served.url)["knobs"]["max_num_batched_tokens"] != 3
        _screenshot(page, tmp_path / "knobs.png")

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
        expect(page.get_by_text(f"expert_placement {version}→{version + 1}").first).to_be_visible(
            timeout=WAIT_MS
        )
        expect(page.get_by_text(f"(placement v{version + 1})")).to_be_visible(timeout=WAIT_MS)
        _screenshot(page, tmp_path / "rebalance.png")
        print(f"screenshots in {tmp_path}")
        browser.close()


def test_replay_page_in_a_browser(served: Served, dashboard_url: str, tmp_path: Path) -> None:
    traffic(served.loop, 2, 8)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(dashboard_url + "/replay")
        page.locator('[data-testid="stSelectbox"]').filter(has_text="speed").click()
        page.get_by_role("option", name="as fast as possible").click()
        page.get_by_role("button", name="Play").click()
        expect(page.get_by_text("ended", exact=True)).to_be_visible(timeout=WAIT_MS)
        expect(page.locator(MAIN_CHARTS)).to_have_count(len(PANELS), timeout=WAIT_MS)
        _screenshot(page, tmp_path / "replay.png")
        browser.close()
