"""The dashboard benchmark's measurements in the browser: a Live page's first chart, its
panels' redraw rates, an Apply click timed to the server's new knob version and to its
marker on the charts, a sidebar page switch, and whether any chart was ever in Streamlit's
stale state."""

from __future__ import annotations

import time
from typing import Any

from playwright.sync_api import BrowserContext, Frame, Page

COMPONENT = 'iframe[title="dashboard.live_charts.live_charts"]'
WAIT_MS = 60_000
VIEWPORT = {"width": 1600, "height": 1000}  # the window: the first rows on screen
# whether the live-charts component shows a panel drawn with steps
DRAWN = """() => {
    const frame = document.querySelector('iframe[title="dashboard.live_charts.live_charts"]');
    const panel = frame && frame.contentDocument &&
        frame.contentDocument.querySelector('[data-panel="batch"]');
    return Boolean(panel && panel.data && panel.data[0] && panel.data[0].x.length);
}"""
# counts the times an element container holding the charts turns stale (Streamlit fades it
# while a rerun has not reached it yet)
WATCH_STALE = """() => {
    window.staleCharts = 0;
    new MutationObserver((records) => {
        for (const r of records) {
            const el = r.target;
            if (el.dataset.stale === "true" &&
                el.querySelector('iframe, [data-testid="stPlotlyChart"]')) window.staleCharts++;
        }
    }).observe(document.body, {subtree: true, attributes: true, attributeFilter: ["data-stale"]});
}"""
# panel -> [redraws so far, ms of the last]
DRAWS = """() => Object.fromEntries([...document.querySelectorAll('[data-panel]')]
    .map((d) => [d.dataset.panel, [Number(d.dataset.draws), Number(d.dataset.ms || 0)]]))"""


def charts_frame(page: Page) -> Frame:
    handle = page.wait_for_selector(COMPONENT, timeout=WAIT_MS)
    assert handle is not None
    frame = handle.content_frame()
    assert frame is not None
    return frame


def open_live(context: BrowserContext, url: str) -> Page:
    """A Live page on its way (its first chart: `wait_drawn`)."""
    page = context.new_page()
    page.goto(url, wait_until="commit")
    return page


def wait_drawn(page: Page) -> None:
    """Until the page's live charts show a panel drawn with steps."""
    page.wait_for_function(DRAWN, timeout=WAIT_MS, polling=20)


def redraw_rates(frame: Frame, seconds: float) -> dict[str, tuple[float, float]]:
    """Per panel drawn in `seconds`: redraws per second and the last redraw's ms."""
    before = frame.evaluate(DRAWS)
    t0 = time.perf_counter()
    frame.page.wait_for_timeout(seconds * 1000)
    after = frame.evaluate(DRAWS)
    span = time.perf_counter() - t0
    return {
        name: ((n - before[name][0]) / span, ms)
        for name, (n, ms) in after.items()
        if n > before[name][0]
    }


def watch_stale(page: Page) -> None:
    page.evaluate(WATCH_STALE)


def stale_count(page: Page) -> int:
    return int(page.evaluate("() => window.staleCharts"))


# keeps the time (epoch s) of the page's next click event, as the browser stamped it
WATCH_CLICK = """() => document.addEventListener(
    "click", (e) => { window.clickedAt = (performance.timeOrigin + e.timeStamp) / 1000; },
    {capture: true, once: true})"""
# the time (epoch s) when the first chart shows a marker whose label starts with `label`
MARKER_TIME = """label => [...document.querySelectorAll('[data-panel="batch"] .annotation-text')]
    .some((t) => t.textContent.startsWith(label))
    && (performance.timeOrigin + performance.now()) / 1000"""


def apply_click(page: Page, frame: Frame, value: int, version: int) -> tuple[float, float]:
    """Sets max_num_seqs to `value` in the knob form, at knob version `version`, and clicks
    Apply: when the click event happened (epoch s, the browser's stamp, so that Playwright's
    own checks before a click do not count) and when the change's marker was first seen on
    the first chart (polled every 20 ms). Returns once the form shows the new version, ready
    for the next click."""
    page.get_by_role("spinbutton", name="max_num_seqs").fill(str(value))
    page.evaluate(WATCH_CLICK)
    page.get_by_role("button", name="Apply").click()
    seen = frame.wait_for_function(
        MARKER_TIME, arg=f"v{version + 1}: max_num_seqs", timeout=WAIT_MS, polling=20
    )
    page.get_by_text(f"version {version + 1} (applied").wait_for(timeout=WAIT_MS)
    return float(page.evaluate("() => window.clickedAt")), float(seen.json_value())


def switch_page(page: Page, name: str, drawn: str) -> tuple[float, Any]:
    """Clicks page `name` in the sidebar; seconds until the old page's charts are gone and
    `drawn` (a JS condition) holds, and the condition's value then."""
    old = page.query_selector(COMPONENT)
    t0 = time.perf_counter()
    page.locator('[data-testid="stSidebarNav"]').get_by_text(name, exact=True).click()
    if old is not None:
        old.wait_for_element_state("hidden", timeout=WAIT_MS)
    held = page.wait_for_function(drawn, timeout=WAIT_MS, polling=20)
    return time.perf_counter() - t0, held.json_value()


def wait_idle(page: Page) -> None:
    """Until the page's script has finished its run (as one does before leaving a page)."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')",
        timeout=WAIT_MS,
    )


# when (epoch ms) the charts' frame started, loaded plotly.js, connected its websocket and
# was seen drawn, read from the frame whose first chart is drawn then (Streamlit may mount
# the component's frame more than once while the page's script runs)
DRAWN_STARTED = """() => {
    const frame = document.querySelector('iframe[title="dashboard.live_charts.live_charts"]');
    const doc = frame && frame.contentDocument;
    const panel = doc && doc.querySelector('[data-panel="batch"]');
    if (!(panel && panel.data && panel.data[0] && panel.data[0].x.length)) return false;
    const p = frame.contentWindow.performance;
    const at = (name) => p.timeOrigin + p.getEntriesByName(name)[0].startTime;
    const marked = (name) => p.getEntriesByName(name).length;
    return marked("plotly loaded") && marked("connected") &&
        [p.timeOrigin, at("plotly loaded"), at("connected"), p.timeOrigin + p.now()];
}"""


def switch_to_live(page: Page) -> tuple[float, list[float]]:
    """Clicks Live in the sidebar: seconds until the first chart is drawn; and until that
    chart's frame started, had plotly.js, had its websocket open and was seen drawn, on the
    frame's clock (which may run a tenth of a second apart from this process's)."""
    clicked = time.time()
    drawn, started = switch_page(page, "Live", DRAWN_STARTED)
    return drawn, [ms / 1000 - clicked for ms in started]


# Compare's component: both sessions' throughput panels drawn with their recorded steps
COMPARE_DRAWN = """() => {
    const frame = document.querySelector('iframe[title="dashboard.live_charts.live_charts"]');
    const doc = frame && frame.contentDocument;
    const panels = doc ? [...doc.querySelectorAll('.source [data-panel="throughput"]')] : [];
    return panels.length === 2 && panels.every((p) => p.data && p.data[0] && p.data[0].x.length);
}"""
REPLAY_READY = """() => [...document.querySelectorAll('button')]
    .some((b) => b.innerText.trim() === "Play")"""
