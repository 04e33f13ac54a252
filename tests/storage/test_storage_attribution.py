"""Attribution of recorded sessions: the queries it reads, `moescope sessions show
--attribution` on a session a real server recorded, and sessions recorded before telemetry v2
refused over HTTP and on the command line."""

import json
import time
from typing import Any

import httpx
import pytest
from api_servers import MODEL, serve, stop
from storage_helpers import bare_recorder, request_record, run_requests, step_record, wait_for

from cli.main import main
from server.session_attribution import session_report
from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder, Store
from storage import queries as q

V1_MESSAGE = (
    "step 0 was recorded with telemetry v1; attribution needs v2 or later (record the session "
    "again with this version)"
)


@pytest.fixture
def queued(db_url: str) -> str:
    """A session recorded by a real server with one batch slot, of four requests sent at once."""
    served = serve(ServerSettings(model_name=MODEL, db_url=db_url), max_num_seqs=1)
    try:
        run_requests(served.loop, 4, 4)
        recorder: Recorder = state_of(served.app).recorder
        loop = served.loop
        wait_for(lambda: recorder.flush() and recorder.written_steps == loop.steps)
        return served.loop.engine.session
    finally:
        stop(served)


def v1_session(url: str) -> None:
    """Session `main`: three steps and a request recorded before the scheduler said why
    requests waited (telemetry v1)."""
    store = Store(url)
    rec, steps, requests = bare_recorder(store)
    t = time.time()
    for i in range(3):
        steps.publish({**step_record(i, t + i * 0.01), "v": 1})
    requests.publish(request_record("r0", t, 4, 2))
    rec.close()
    store.close()


def show(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(["sessions", "show", *argv])
    return capsys.readouterr().out


def test_the_attribution_table_names_the_causes_and_the_dominant_one(
    db_url: str, queued: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = show(capsys, queued, "--attribution", "--db", db_url)
    store = Store(db_url, create=False)
    report = session_report(store, queued)
    store.close()
    assert report["requests"] == 4 and report["dominant"]["ttft"]["cause"] == "queue_slots"
    lines = out.splitlines()
    assert lines[0].startswith("4 requests: each cause's share of the time")
    assert lines[1].split() == [
        "cause",
        "TTFT",
        "TTFT",
        "p90",
        "TPOT",
        "TPOT",
        "p90",
        "what",
        "it",
        "is",
    ]
    (row,) = [line for line in lines if line.startswith("queue_slots ")]
    share = f"{report['ttft']['queue_slots'] * 100:.1f}%"
    p90 = f"{report['ttft_p90']['queue_slots'] * 100:.1f}%"
    assert row.split()[1:5] == [share, p90, "-", "-"]
    assert row.endswith("queueing for a slot: max_num_seqs")
    assert f"dominant TTFT cause: {report['dominant']['ttft']['text']}" in lines
    assert "of p90 TTFT is queueing for a slot: max_num_seqs" in out
    assert any(line.startswith("dominant TPOT cause: ") for line in lines)


def test_the_attribution_json_is_the_report(
    db_url: str, queued: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = json.loads(show(capsys, queued, "--attribution", "--json", "--db", db_url))
    store = Store(db_url, create=False)
    assert out == json.loads(json.dumps(session_report(store, queued)))
    store.close()
    assert out["session"] == queued and len(out["recent"]) == 4


def test_a_v1_session_is_refused_by_the_cli_and_the_api(db_url: str) -> None:
    v1_session(db_url)
    with pytest.raises(SystemExit) as info:
        main(["sessions", "show", "main", "--attribution", "--db", db_url])
    assert str(info.value) == f"moescope sessions show: {V1_MESSAGE}"
    served = serve(ServerSettings(model_name=MODEL, db_url=db_url, record=False))
    try:
        for path in ("/api/sessions/main/attribution", "/api/sessions/main/requests/r0/timeline"):
            resp = httpx.get(served.url + path, timeout=30)
            assert resp.status_code == 422, resp.text
            assert resp.json()["error"] == {
                "message": V1_MESSAGE,
                "type": "invalid_request_error",
                "param": "session",
                "code": 422,
            }
    finally:
        stop(served)


def test_requests_and_steps_by_id_and_by_time(db_url: str) -> None:
    store = Store(db_url)
    rec, steps, requests = bare_recorder(store)
    t = time.time()
    for i in range(10):
        steps.publish(step_record(i, t + i))
    for req, arrival in (("a", t), ("b", t + 2), ("a", t + 4)):  # "a" reused once it ended
        requests.publish(request_record(req, arrival, 4, 2))
    rec.close()
    record: dict[str, Any] | None = q.request_record(store, "main", "a")
    assert record is not None and record["arrival"] == t + 4
    assert q.request_record(store, "main", "c") is None
    ended = q.requests(store, "main", t + 2.4, t + 4.6)  # each ends 0.5 s after arriving
    assert [r["req"] for r in ended] == ["b", "a"]
    assert [r["req"] for r in q.requests(store, "main", ended_to=t + 1)] == ["a"]
    assert [s["step"] for s in q.all_steps(store, "main", t + 2.5, t + 5)] == [3, 4, 5]
    assert len(q.all_steps(store, "main")) == 10
    store.close()
