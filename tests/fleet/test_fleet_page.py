"""The Fleet page in headless Chromium: both replicas' rows, then a click into one replica's
Live page, whose charts draw that replica's steps through the ingress."""

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import (
    CHROMIUM,
    COMPONENT,
    VIEWPORT,
    WAIT_MS,
    charts,
    chromium,
    dashboard,
    wait_drawn_past,
)
from fleet_checks import MODEL, live_rows, wait_for
from playwright.sync_api import expect

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


@pytest.fixture
def load(fleet: Any) -> Iterator[None]:
    """Requests one after another until the test ends, so the engines step."""
    done = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=fleet.url, timeout=120) as c:
            while not done.is_set():
                c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 16})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join(130)


def test_fleet_page_rows_and_a_click_into_one_replica(
    fleet: Any, client: httpx.Client, load: None, tmp_path: Path
) -> None:
    rows = wait_for(lambda: len(live_rows(client)) == 2 and live_rows(client), "2 replicas")
    with dashboard(fleet.url, tmp_path / "streamlit.log") as url, chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url + "/fleet")
        table = page.locator('[data-testid="stTable"]')
        expect(table).to_be_visible(timeout=3 * WAIT_MS)
        for row in rows:
            expect(table).to_contain_text(row["replica"], timeout=WAIT_MS)
        restarts = page.locator('[data-testid="stMetric"]', has_text="restarts")
        expect(restarts).to_contain_text("0", timeout=WAIT_MS)
        chosen = rows[1]["replica"]
        for row in rows:
            expect(page.get_by_role("button", name=f"Live: {row['replica']}")).to_be_visible(
                timeout=WAIT_MS
            )
        page.get_by_role("button", name=f"Live: {chosen}").click()
        sidebar = page.locator('[data-testid="stSidebar"]')
        expect(sidebar.get_by_text(f"/replicas/{chosen}")).to_be_visible(timeout=WAIT_MS)
        # the Live page builds its component once the replica answers: slow on 2 busy cores
        page.wait_for_selector(COMPONENT, timeout=3 * WAIT_MS)
        frame = charts(page)
        wait_drawn_past(frame, 0)  # steps drawn from the replica's telemetry via the ingress
