"""A recorded session's steps read in the browser from GET /api/sessions/{id}/steps, page
after page (live_charts_web/recording.js, the Compare page's source), against routes that
page, refuse or fail and come back."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from browser import CHROMIUM, WAIT_MS
from frames import frame
from js_modules import ORIGIN, js_page
from playwright.sync_api import Page, Route

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]

URL = f"{ORIGIN}/api/sessions/s/steps"
# a Recording into a Feed, its states and pages kept on window.rec
START = """async ([url, token, maxSteps]) => {
    const m = await modules();
    const feed = new m.Feed(new m.StepWindow(maxSteps));
    const rec = {states: [], pages: [], feed};
    rec.recording = new m.Recording(url, token, maxSteps, {
        onSteps: (steps) => { rec.pages.push(steps.length); feed.steps(steps); },
        onState: (state, detail) => rec.states.push([state, detail]),
    }).start();
    window.rec = rec;
}"""
DONE = "() => window.rec && ['loaded', 'refused'].includes(window.rec.states.at(-1)[0])"
RESULT = """() => ({states: rec.states, pages: rec.pages, steps: rec.feed.window.view().steps,
    received: rec.feed.received, malformed: rec.feed.malformed})"""


class Steps:
    """The route as the server answers it: `limit` steps from `from` of `n`, with `next`;
    request i (from 0) gets `fail[i]`, (status, body), instead."""

    def __init__(self, page: Page, n: int, fail: dict[int, tuple[int, Any]] | None = None):
        self.n = n
        self.fail = fail or {}
        self.asked: list[dict[str, Any]] = []
        page.route(f"{ORIGIN}/api/**", self._answer)

    def _answer(self, route: Route) -> None:
        query = {k: v[0] for k, v in parse_qs(urlparse(route.request.url).query).items()}
        failed = self.fail.get(len(self.asked))
        self.asked.append({**query, "auth": route.request.headers.get("authorization")})
        if failed:
            status, body = failed
            route.fulfill(status=status, body=json.dumps(body), content_type="application/json")
            return
        start, limit = int(query.get("from", 0)), int(query.get("limit", 1000))
        steps = [frame(i) for i in range(start, min(start + limit, self.n))]
        more = len(steps) == limit and start + limit < self.n
        body = {"session": "s", "steps": steps, "next": start + limit if more else None}
        route.fulfill(body=json.dumps(body), content_type="application/json")


@pytest.fixture
def page() -> Iterator[Page]:
    with js_page() as p:
        yield p


def _load(page: Page, token: str = "", max_steps: int = 3000) -> dict[str, Any]:
    page.evaluate(START, [URL, token, max_steps])
    page.wait_for_function(DONE, timeout=WAIT_MS)
    return page.evaluate(RESULT)


def test_the_first_max_steps_are_read_page_by_page_with_the_key(page: Page) -> None:
    route = Steps(page, 2500)
    got = _load(page, "sk-key", max_steps=2200)
    assert got["states"] == [["loading", ""], ["loaded", ""]]
    assert got["pages"] == [1000, 1000, 200] and got["steps"] == list(range(2200))
    assert (got["received"], got["malformed"]) == (2200, 0)
    asked = [(a.get("from"), a["limit"]) for a in route.asked]
    assert asked == [(None, "1000"), ("1000", "1000"), ("2000", "200")]
    assert {a["auth"] for a in route.asked} == {"Bearer sk-key"}


def test_a_short_recording_is_one_page(page: Page) -> None:
    route = Steps(page, 30)
    got = _load(page)
    assert got["pages"] == [30] and got["steps"] == list(range(30))
    assert got["states"][-1] == ["loaded", ""]
    assert route.asked[0]["auth"] is None  # no key, no header


def test_a_refusal_is_shown_and_not_asked_again(page: Page) -> None:
    route = Steps(page, 30, {0: (404, {"error": {"message": "no session 's'"}})})
    got = _load(page)
    assert got["states"] == [["loading", ""], ["refused", "404: no session 's'"]]
    assert got["steps"] == [] and len(route.asked) == 1


def test_a_failing_server_is_asked_again_from_the_page_it_stopped_at(page: Page) -> None:
    route = Steps(page, 1500, {1: (503, "busy")})  # the second page fails once
    got = _load(page)
    assert [s for s, _ in got["states"]] == ["loading", "retrying", "loaded"]
    assert got["steps"] == list(range(1500))  # nothing twice, nothing missed
    assert [a.get("from") for a in route.asked] == [None, "1000", "1000"]


def test_an_answer_without_steps_is_named(page: Page) -> None:
    Steps(page, 30, {0: (200, {"session": "s"})})
    got = _load(page)
    assert got["states"][-1] == ["refused", "cannot read the server's answer: no steps in it"]
