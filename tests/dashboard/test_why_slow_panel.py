"""The "Why slow?" panel against a small HTTP server serving the attribution routes: the
client's calls, and the panel on the Live and Replay pages (Streamlit AppTest), including
an old recording's refusal."""

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_servers import TIMEOUT, wait_for
from attribution_report import report
from fake_server import FakeServer, fake_server
from streamlit.testing.v1 import AppTest

from dashboard.client import get_attribution, get_session_attribution

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")
OLD = (
    "step 0 was recorded with telemetry v1; attribution needs v2 or later (record the "
    "session again with this version)"
)
SESSIONS = [
    {"id": "new", "label": "new", "kind": "live", "steps": 100, "duration_s": 200.0},
    {"id": "old", "label": "old", "kind": "live", "steps": 100, "duration_s": 10.0},
]


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": 422}}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server(
        {
            "/api/attribution": (200, report()),
            "/api/sessions": (200, {"sessions": SESSIONS}),
            "/api/sessions/new/attribution": (200, report()),
            "/api/sessions/old/attribution": (422, _error(OLD)),
        }
    ) as fake:
        yield fake


def test_client_asks_the_live_route_for_its_window(server: FakeServer) -> None:
    assert get_attribution(server.url, 60.0, 5.0, 50) == (True, report())
    (query,) = server.queries("/api/attribution")
    assert {k: float(v[0]) for k, v in query.items()} == {
        "window_s": 60.0,
        "bucket_s": 5.0,
        "recent": 50.0,
    }


def test_client_gives_an_old_sessions_refusal_in_the_servers_words(server: FakeServer) -> None:
    assert get_session_attribution(server.url, "new", 2.0, 10) == (True, report())
    assert get_session_attribution(server.url, "old", 2.0, 10) == (False, OLD)
    (query,) = server.queries("/api/sessions/new/attribution")
    assert query == {"bucket_s": ["2.0"], "recent": ["10"]}


def test_client_says_when_the_server_is_unreachable() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ok, message = get_attribution(f"http://127.0.0.1:{port}", 60.0, 5.0, 50)
    assert not ok and message.startswith("server unreachable")


def _why_slow(at: AppTest, key: str) -> list[str]:
    """The keys of the panel's charts on the page."""
    return sorted(
        c.proto.id.rsplit("-", 1)[-1] for c in at.get("plotly_chart") if f"-{key}_" in c.proto.id
    )


def _markdown(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown]


def test_live_page_shows_the_live_windows_causes(server: FakeServer) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["url"] = server.url
    at.run()
    assert not at.exception
    poller = at.session_state["attribution_poller"]
    try:
        wait_for(lambda: poller.answers >= 1, what="the attribution")
        at.run()
        assert not at.exception
        assert _why_slow(at, "why_live") == ["why_live_tpot", "why_live_ttft", "why_live_waterfall"]
        assert "**62% of p90 TTFT is queueing for a slot: max_num_seqs**" in _markdown(at)
        assert "**90% of p90 TPOT is decode steps**" in _markdown(at)
        assert "3 requests ended in the last 60 s" in [c.value for c in at.caption]
        assert server.queries("/api/attribution")[0]["window_s"] == ["60.0"]
    finally:
        poller.stop()


def test_live_panel_shows_the_servers_message(server: FakeServer) -> None:
    server.routes["/api/attribution"] = (503, _error("the engine is not running"))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["url"] = server.url
    at.run()
    poller = at.session_state["attribution_poller"]
    try:
        wait_for(lambda: poller.answers >= 1, what="the attribution")
        at.run()
        assert not at.exception
        assert "the engine is not running" in [w.value for w in at.warning]
        assert _why_slow(at, "why_live") == []
    finally:
        poller.stop()


def _replay_script() -> None:
    from dashboard import replay

    replay.page()


def _play(at: AppTest, session: dict[str, Any]) -> None:
    at.selectbox(key="replay_session").set_value(session)
    at.button(key="replay_play").click().run()
    assert not at.exception


def test_replay_page_shows_the_replayed_sessions_causes_or_why_it_cannot(
    server: FakeServer,
) -> None:
    at = AppTest.from_function(_replay_script, default_timeout=TIMEOUT)
    at.session_state["url"] = server.url
    at.run()
    assert not at.exception and _why_slow(at, "why_replay") == []  # nothing played yet
    _play(at, SESSIONS[0])
    assert _why_slow(at, "why_replay") == [
        "why_replay_tpot",
        "why_replay_ttft",
        "why_replay_waterfall",
    ]
    assert "**62% of p90 TTFT is queueing for a slot: max_num_seqs**" in _markdown(at)
    assert "3 requests in the session" in [c.value for c in at.caption]
    (query,) = server.queries("/api/sessions/new/attribution")
    assert query["bucket_s"] == ["5"]  # 200 s in 40 bars
    _play(at, SESSIONS[1])
    assert OLD in [w.value for w in at.warning]
    assert _why_slow(at, "why_replay") == []
