"""The dashboard's browser tests' helpers: `python -m dashboard` for a server URL, headless
Chromium, and the live-charts component's frame in a page."""

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from api_servers import wait_for
from playwright.sync_api import Browser, Frame, Page, sync_playwright

from dashboard.__main__ import command
from engine.ep.ranks import free_port

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1600, "height": 3600}  # tall enough that every panel is on screen
WAIT_MS = 60_000  # for the page to show something: generous, since only a hang should reach it
COMPONENT = 'iframe[title="dashboard.live_charts.live_charts"]'


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/_stcore/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def dashboard(server_url: str, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`python -m dashboard` for the server at `server_url` (with `env` added to this
    process's environment), its output in `log`; yields its URL once it answers."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            command(server_url, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _up(url), what="streamlit to start")
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def charts(page: Page) -> Frame:
    """The live-charts component's frame, once its panels are laid out."""
    handle = page.wait_for_selector(COMPONENT, timeout=WAIT_MS)
    assert handle is not None
    frame = handle.content_frame()
    assert frame is not None
    frame.wait_for_selector('[data-panel="batch"]', state="attached", timeout=WAIT_MS)
    return frame


def drawn_step(frame: Frame, panel: str = "batch") -> int:
    """The newest step drawn in a time-series panel (-1 before its first draw)."""
    return int(frame.evaluate(DRAWN_STEP, panel))


DRAWN_STEP = """panel => {
    const data = document.querySelector(`[data-panel="${panel}"]`).data;
    const x = data && data.length ? data[0].x : [];
    return x.length ? x[x.length - 1] : -1;
}"""


def wait_drawn_past(frame: Frame, step: int, panel: str = "batch") -> None:
    """Until `panel` has drawn a step after `step`."""
    frame.wait_for_function(f"panel => ({DRAWN_STEP})(panel) > {step}", arg=panel, timeout=WAIT_MS)
