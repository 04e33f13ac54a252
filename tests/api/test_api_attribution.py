"""Latency attribution over HTTP: live timelines and reports from a real server's live window,
and the same from its recording in a real SQLite file."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_servers import MODEL, Served, serve, stop, traffic, wait_for, wait_idle

import server.live_window
from engine import SamplingParams
from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder

pytestmark = pytest.mark.slow  # real servers run and record requests first

SUMMARY = ("requests", "ttft", "tpot", "ttft_p90", "tpot_p90", "dominant")


@dataclass
class Recorded:
    served: Served
    session: str
    ids: list[str]

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.served.url + path, params=params, timeout=60)


def recording_server(db: Path, **engine_args: Any) -> tuple[Served, str]:
    served = serve(ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}"), **engine_args)
    return served, served.loop.engine.session


def run(served: Served, n: int, max_tokens: int) -> list[str]:
    """`n` requests at once, until they have ended and been recorded; their ids."""
    ids = traffic(served.loop, n, max_tokens)
    wait_idle(served.loop)
    recorder: Recorder = state_of(served.app).recorder
    loop = served.loop
    wait_for(lambda: recorder.flush() and recorder.written_steps == loop.steps, what="recording")
    return ids


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """A server with two batch slots that records six requests sent at once: four queue. Its
    experts are placed on two modeled ranks, so the busier one's straggling shows too."""
    served, session = recording_server(
        tmp_path_factory.mktemp("db") / "moescope.db", max_num_seqs=2, ep_size=2
    )
    ids = run(served, 6, 8)
    yield Recorded(served, session, ids)
    stop(served)


def error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    return dict(resp.json()["error"])


def test_an_ended_request_has_a_live_timeline_whose_causes_add_up(recorded: Recorded) -> None:
    queued = 0
    for rid in recorded.ids:
        resp = recorded.get(f"/api/requests/{rid}/timeline")
        assert resp.status_code == 200, resp.text
        t = resp.json()
        assert t["req"] == rid and t["source"] == "live" and t["output_len"] == 8
        ttft = sum(t["ttft"].values())
        after = sum(t["after_first_token"].values())
        assert ttft == pytest.approx(t["ttft_ms"], rel=0.02)
        assert ttft + after == pytest.approx(t["e2e_ms"], rel=0.02)
        assert t["phases"][0]["t0"] == t["arrival"] and t["phases"][-1]["t1"] == t["end"]
        queued += "queue_slots" in t["ttft"]
    assert queued >= 4  # two slots for six requests


def test_the_live_and_the_recorded_timeline_agree(recorded: Recorded) -> None:
    """The live window keeps only what attribution reads of each step: it reads the same."""
    straggled = 0
    for rid in recorded.ids:
        live = recorded.get(f"/api/requests/{rid}/timeline").json()
        resp = recorded.get(f"/api/sessions/{recorded.session}/requests/{rid}/timeline")
        assert resp.status_code == 200, resp.text
        stored = resp.json()
        assert stored.pop("source") == "session" and stored.pop("session") == recorded.session
        assert live.pop("source") == "live"
        assert live == stored
        straggled += "straggler" in live["after_first_token"]
    assert straggled


def test_the_live_report_matches_the_recorded_one(recorded: Recorded) -> None:
    resp = recorded.get("/api/attribution", window_s=600, bucket_s=1, recent=3)
    assert resp.status_code == 200, resp.text
    live = resp.json()
    assert live["requests"] >= len(recorded.ids) and live["fell_out"] == 0
    assert live["from"] < live["to"] and len(live["recent"]) == 3
    assert sum(live["ttft"].values()) == pytest.approx(1.0, abs=1e-3)
    assert live["dominant"]["ttft"]["cause"] == "queue_slots"
    assert "max_num_seqs" in live["dominant"]["ttft"]["text"]
    assert sum(b["requests"] for b in live["over_time"]) == live["requests"]
    window = {"from": live["from"], "to": live["to"], "bucket_s": 1, "recent": 3}
    resp = recorded.get(f"/api/sessions/{recorded.session}/attribution", **window)
    assert resp.status_code == 200, resp.text
    stored = resp.json()
    assert {k: stored[k] for k in SUMMARY} == {k: live[k] for k in SUMMARY}
    assert stored["recent"] == live["recent"] and stored["over_time"] == live["over_time"]


def test_a_whole_session_report_and_a_window_of_it(recorded: Recorded) -> None:
    base = f"/api/sessions/{recorded.session}/attribution"
    whole = recorded.get(base).json()
    assert whole["requests"] == len(recorded.ids) and whole["from"] is None
    ends = sorted(t["end"] for t in recorded.get(base, recent=100).json()["recent"])
    part = recorded.get(base, **{"from": ends[2], "to": ends[4]}).json()
    assert part["requests"] == sum(ends[2] <= end <= ends[4] for end in ends) < len(ends)
    assert (part["from"], part["to"]) == (ends[2], ends[4])


def test_unknown_and_running_requests_are_404(recorded: Recorded) -> None:
    err = error(recorded.get("/api/requests/nope/timeline"), 404)
    assert err["param"] == "request_id"
    assert "no request 'nope' ended in the live window" in err["message"]
    assert f"GET /api/sessions/{recorded.session}/requests/nope/timeline" in err["message"]
    err = error(recorded.get(f"/api/sessions/{recorded.session}/requests/nope/timeline"), 404)
    assert err["param"] == "request_id"
    err = error(recorded.get(f"/api/sessions/nosuch/requests/{recorded.ids[0]}/timeline"), 404)
    assert err["param"] == "session_id"
    assert error(recorded.get("/api/sessions/nosuch/attribution"), 404)["param"] == "session_id"
    loop = recorded.served.loop
    params = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)
    rid = loop.submit(list(range(1, 24)), params, lambda _: None)

    def running() -> bool:
        resp = recorded.get(f"/api/requests/{rid}/timeline")
        return resp.status_code == 404 and "has not ended yet" in resp.json()["error"]["message"]

    wait_for(running, what="the request to run")
    loop.abort(rid)
    wait_for(lambda: recorded.get(f"/api/requests/{rid}/timeline").status_code == 200)
    assert 0 < recorded.get(f"/api/requests/{rid}/timeline").json()["output_len"] < 900


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": 9, "to": 3}, "from"),
        ({"from": -1}, "from"),
        ({"to": "x"}, "to"),
        ({"bucket_s": 0}, "bucket_s"),
        ({"bucket_s": "inf"}, "bucket_s"),
        ({"recent": -1}, "recent"),
        ({"recent": 1001}, "recent"),
    ],
)
def test_bad_session_report_parameters_are_a_422_naming_them(
    recorded: Recorded, params: dict[str, Any], field: str
) -> None:
    resp = recorded.get(f"/api/sessions/{recorded.session}/attribution", **params)
    assert error(resp, 422)["param"] == field


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": "a minute"}, "window_s"),
        ({"window_s": "nan"}, "window_s"),
        ({"bucket_s": -5}, "bucket_s"),
        ({"recent": "all"}, "recent"),
    ],
)
def test_bad_live_report_parameters_are_a_422_naming_them(
    served: Served, params: dict[str, Any], field: str
) -> None:
    resp = httpx.get(served.url + "/api/attribution", params=params, timeout=30)
    assert error(resp, 422)["param"] == field


def test_without_a_database_the_live_routes_serve_and_say_so(served: Served) -> None:
    err = error(httpx.get(served.url + "/api/requests/nope/timeline", timeout=30), 404)
    assert "this server records no session" in err["message"]
    resp = httpx.get(served.url + "/api/attribution", timeout=30)
    assert resp.status_code == 200 and resp.json()["source"] == "live"
    resp = httpx.get(served.url + "/api/sessions/x/attribution", timeout=30)
    assert resp.status_code == 503


def test_a_request_whose_steps_fell_out_of_the_window_points_to_its_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 8 steps kept, a request of 4 tokens falls out behind one of 12; one of 3 stays."""
    monkeypatch.setattr(server.live_window, "ATTRIBUTION_STEPS", 8)
    served, session = recording_server(tmp_path / "moescope.db")
    try:
        (old,) = run(served, 1, 4)
        (long,) = run(served, 1, 12)
        (new,) = run(served, 1, 3)

        def get(path: str) -> httpx.Response:
            return httpx.get(served.url + path, timeout=30)

        for rid in (old, long):
            err = error(get(f"/api/requests/{rid}/timeline"), 404)
            assert "fell out of the live window" in err["message"]
            recorded = f"/api/sessions/{session}/requests/{rid}/timeline"
            assert f"GET {recorded}" in err["message"]
            resp = get(recorded)
            assert resp.status_code == 200 and resp.json()["output_len"] in (4, 12)
        assert get(f"/api/requests/{new}/timeline").status_code == 200
        report = get("/api/attribution").json()
        assert report["requests"] == 1 and report["fell_out"] == 2
        assert [t["req"] for t in report["recent"]] == [new]
    finally:
        stop(served)
