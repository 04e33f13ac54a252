"""End to end: a real server, `python -m dashboard` (streamlit run) and headless Chromium."""

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_servers import Served, traffic, wait_for
from playwright.sync_api import Page, expect, sync_playwright

from dashboard.__main__ import command
from dashboard.client import get_knobs

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/_stcore/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def dashboard_url(served: Served, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    log = (tmp_path / "streamlit.log").open("w")
    proc = subprocess.Popen(command(served.url, port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), 30, "streamlit to start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def load(served: Served) -> Iterator[None]:
    """Requests keep arriving while the test runs."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            traffic(served.loop, 4, 64)
            stop.wait(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


def _step(page: Page) -> int:
    text = page.locator('[data-testid="stMetric"]').nth(1).locator(
        '[data-testid="stMetricValue"]').inner_text()
    return int(text) if text.isdigit() else -1


def test_live_page_in_a_browser(served: Served, dashboard_url: str, load: None,
                                tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.goto(dashboard_url)
        expect(page.locator(".js-plotly-plot")).to_have_count(10, timeout=30_000)
        expect(page.get_by_text("connected", exact=True)).to_be_visible()
        first = _step(page)
        deadline = time.monotonic() + 15
        while _step(page) <= first and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert _step(page) > first
        page.screenshot(path=tmp_path / "live.png", full_page=True)

        old = get_knobs(served.url)["knobs"]["max_num_seqs"]
        new = 5 if old != 5 else 7
        page.get_by_role("spinbutton", name="max_num_seqs").fill(str(new))
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text("accepted as version")).to_be_visible(timeout=10_000)
        assert get_knobs(served.url)["knobs"]["max_num_seqs"] == new
        expect(page.get_by_text(f"max_num_seqs {old}→{new}").first).to_be_visible(timeout=10_000)

        page.get_by_role("spinbutton", name="max_num_batched_tokens").fill("3")
        page.get_by_role("button", name="Apply").click()
        expect(page.get_by_text(f"must be at least max_num_seqs ({new})")).to_be_visible(
            timeout=10_000)
        assert get_knobs(served.url)["knobs"]["max_num_batched_tokens"] != 3
        page.screenshot(path=tmp_path / "knobs.png", full_page=True)
        print(f"screenshots in {tmp_path}")
        browser.close()


def test_replay_page_in_a_browser(served: Served, dashboard_url: str, tmp_path: Path) -> None:
    traffic(served.loop, 2, 8)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.goto(dashboard_url + "/replay")
        page.locator('[data-testid="stSelectbox"]').filter(has_text="speed").click()
        page.get_by_role("option", name="as fast as possible").click()
        page.get_by_role("button", name="Play").click()
        expect(page.get_by_text("ended", exact=True)).to_be_visible(timeout=30_000)
        expect(page.locator(".js-plotly-plot")).to_have_count(10, timeout=10_000)
        page.screenshot(path=tmp_path / "replay.png", full_page=True)
        browser.close()
