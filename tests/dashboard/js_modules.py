"""The live-charts component's JavaScript modules, run in headless Chromium (no server: the
files, and plotly.js for a test that adds it, are served to the page from disk), so tests can
call them on Python's data."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from browser import chromium
from playwright.sync_api import Browser, Page, Route

from dashboard.live_charts import PLOTLY, WEB

ORIGIN = "http://moescope.test"
MODULES = ("stats", "window", "figure", "panels", "feed", "causes", "why_slow", "autopilot")
MODULES += ("reports", "recording")
# a page whose `modules()` gives every module's exports in one object
BLANK = (
    "<!doctype html><title>js</title><script>window.modules = async () => Object.assign({}, "
    + ", ".join(f"await import('/{m}.js')" for m in MODULES)
    + ");</script>"
)


def _serve(route: Route) -> None:
    name = route.request.url.removeprefix(ORIGIN + "/")
    if name == "blank.html":
        route.fulfill(body=BLANK, content_type="text/html")
    elif name == "plotly.min.js":
        route.fulfill(path=PLOTLY / name, content_type="text/javascript")
    else:
        route.fulfill(path=WEB / Path(name).name, content_type="text/javascript")


def blank_page(browser: Browser) -> Page:
    """A new page of `browser` where `run` can call the modules."""
    page = browser.new_page()
    page.route(f"{ORIGIN}/**", _serve)
    page.goto(f"{ORIGIN}/blank.html")
    return page


@contextmanager
def js_page() -> Iterator[Page]:
    """A page where `run` can call the modules, in a browser of its own."""
    with chromium() as browser:
        yield blank_page(browser)


def run(page: Page, function: str, arg: Any = None) -> Any:
    """`function(m, arg)` in the page, `m` holding every module's exports; its result (NaN
    comes back as NaN)."""
    return page.evaluate(
        f"async (arg) => {{ const m = await modules(); return ({function})(m, arg); }}", arg
    )


VIEW = """(m, {frames, maxlen, last}) => {
    const w = new m.StepWindow(maxlen);
    frames.forEach((f) => w.add(f));
    const v = w.view(last ?? undefined);
    const columns = Object.fromEntries(Object.keys(v.rows[0] || {}).map((c) => [c, v.col(c)]));
    return {columns, imbalance: v.imbalance, slots: v.slots, markers: v.markers,
            expertSum: v.expertSum, expertSteps: v.expertSteps, length: v.length,
            latest: v.latest && v.latest.step};
}"""


def js_view(
    page: Page, frames: list[dict[str, Any]], maxlen: int = 600, last: int | None = None
) -> dict[str, Any]:
    """The JS StepWindow's view of `frames`: its columns by name, imbalance, slots, markers,
    expert sum and steps, length and latest step."""
    return run(page, VIEW, {"frames": frames, "maxlen": maxlen, "last": last})


PANEL = """(m, {frames, name}) => {
    const w = new m.StepWindow(600);
    frames.forEach((f) => w.add(f));
    return m.PANELS[name](w.view());
}"""


def js_panel(page: Page, name: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """A panel's {data, layout} over a window of `frames`."""
    return run(page, PANEL, {"frames": frames, "name": name})
