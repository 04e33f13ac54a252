"""A run recorded through the real server, then read, exported, replayed and rerun over HTTP."""

import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from api_servers import MODEL, TIMEOUT, Served, serve, stop, telemetry_ws, wait_idle, ws_connect
from storage_helpers import fresh_url, wait_for
from websockets.sync.client import ClientConnection

from engine.telemetry import StepTelemetry
from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder

PROMPTS = [(5, 9), (17, 4), (30, 12), (8, 20)]  # (prompt tokens, output tokens)


@dataclass
class Recorded:
    served: Served
    session: str

    @property
    def url(self) -> str:
        return self.served.url

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, params=params, timeout=30)

    def ws(self, path: str) -> ClientConnection:
        return ws_connect(self.url.replace("http://", "ws://") + path)


def _recorder(served: Served) -> Recorder:
    return state_of(served.server.server.config.app).recorder


def _complete(url: str, prompt_len: int, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "prompt": list(range(40, 40 + prompt_len)),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    resp = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def recorded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    """A server recording into a fresh database, after four requests and a knob change."""
    url = fresh_url(request.param, tmp_path_factory.mktemp("db"))
    served = serve(ServerSettings(model_name=MODEL, db_url=url, max_prompt_tokens=512))
    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(_complete, served.url, p, n) for p, n in PROMPTS[:2]]
        assert httpx.patch(served.url + "/api/knobs", json={"max_num_seqs": 6}).status_code == 200
        jobs += [pool.submit(_complete, served.url, p, n) for p, n in PROMPTS[2:]]
        for job in jobs:
            job.result()
    wait_idle(served.loop)
    rec = _recorder(served)
    wait_for(lambda: rec.flush() and rec.written_steps == served.loop.steps, what="recording")
    yield Recorded(served, served.loop.engine.session)
    stop(served)


def test_the_run_is_recorded_step_by_step(recorded: Recorded) -> None:
    listing = recorded.get("/api/sessions").json()
    assert listing["recording"] == recorded.session
    (entry,) = [s for s in listing["sessions"] if s["id"] == recorded.session]
    assert entry["kind"] == "server" and entry["model"] == MODEL
    assert entry["steps"] == recorded.served.loop.steps and entry["requests"] == len(PROMPTS)
    assert entry["knobs"]["max_num_seqs"] == 8 and entry["duration_s"] > 0
    info = recorded.get(f"/api/sessions/{recorded.session}").json()
    assert info["recording"] and info["knob_changes"] == 1 and info["dropped"] == 0
    assert info["config"]["model_config"]["num_experts"] == 8
    assert info["request_stats"]["output_tokens"] == sum(n for _, n in PROMPTS)
    steps = recorded.get(f"/api/sessions/{recorded.session}/steps", limit=10000).json()["steps"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        StepTelemetry.model_validate(s)
    assert sum(s["queue"]["finished"] for s in steps) == len(PROMPTS)
    (change,) = recorded.get(f"/api/sessions/{recorded.session}/knob_changes").json()[
        "knob_changes"
    ]
    assert change["changes"] == {"max_num_seqs": [8, 6]} and change["version"] == 2
    reqs = recorded.get(f"/api/sessions/{recorded.session}/requests").json()["requests"]
    assert sorted((r["prompt_len"], r["output_len"]) for r in reqs) == sorted(PROMPTS)
    assert all(r["finish_reason"] == "length" and r["ttft_ms"] > 0 for r in reqs)


def test_step_ranges_and_bad_input(recorded: Recorded) -> None:
    base = f"/api/sessions/{recorded.session}"
    page = recorded.get(base + "/steps", **{"from": 3, "to": 7}).json()
    assert [s["step"] for s in page["steps"]] == [3, 4, 5, 6, 7] and page["next"] is None
    page = recorded.get(base + "/steps", **{"from": 2, "limit": 2}).json()
    assert [s["step"] for s in page["steps"]] == [2, 3] and page["next"] == 4
    for params, field in (
        ({"from": 9, "to": 3}, "from"),
        ({"from": -1}, "from"),
        ({"to": "x"}, "to"),
        ({"limit": 0}, "limit"),
    ):
        resp = recorded.get(base + "/steps", **params)
        assert resp.status_code == 422 and resp.json()["error"]["param"] == field, params
    assert recorded.get(base + "/export", format="csv").status_code == 422
    for method, path in (
        ("GET", ""),
        ("GET", "/steps"),
        ("GET", "/requests"),
        ("GET", "/knob_changes"),
        ("GET", "/export"),
        ("DELETE", ""),
        ("POST", "/rerun"),
    ):
        resp = httpx.request(method, recorded.url + "/api/sessions/nope" + path)
        assert resp.status_code == 404 and "nope" in resp.json()["error"]["message"], path
    resp = httpx.post(recorded.url + "/api/sessions/nope/label", json={"label": "x"})
    assert resp.status_code == 404
    resp = httpx.post(recorded.url + f"{base}/label", json={"name": "x"})
    assert resp.status_code == 422 and "name" in resp.json()["error"]["message"]


def test_export_jsonl_and_parquet(recorded: Recorded) -> None:
    base = f"/api/sessions/{recorded.session}/export"
    n_steps = recorded.get(f"/api/sessions/{recorded.session}").json()["steps"]
    lines = [json.loads(x) for x in recorded.get(base).text.splitlines()]
    kinds = [x["type"] for x in lines]
    assert kinds[0] == "session" and lines[0]["id"] == recorded.session
    assert kinds.count("step") == n_steps and kinds.count("request") == len(PROMPTS)
    assert kinds.count("knob_change") == 1
    resp = recorded.get(base, format="parquet")
    assert resp.status_code == 200 and "parquet" in resp.headers["content-disposition"]
    table = pq.read_table(io.BytesIO(resp.content))
    assert table.num_rows == n_steps
    assert table.column("step").to_pylist() == list(range(n_steps))
    assert len(table.column("expert_counts")[0].as_py()) == 2  # layers of synthetic:tiny
    steps = [x for x in lines if x["type"] == "step"]
    for column, key in (
        ("a2a_bytes", "bytes"),
        ("a2a_gather_bytes", "gather_bytes"),
        ("a2a_ep_size", "ep_size"),
        ("a2a_rank_tokens", "rank_tokens"),
        ("a2a_rank_moe_ms", "rank_moe_ms"),
        ("a2a_imbalance", "imbalance"),
        ("a2a_placement_version", "placement_version"),
    ):
        assert table.column(column).to_pylist() == [s["a2a"][key] for s in steps]
    meta = json.loads(table.schema.metadata[b"moescope.session"])
    assert meta["id"] == recorded.session
    reqs = pq.read_table(io.BytesIO(recorded.get(base, format="parquet", table="requests").content))
    assert sorted(
        zip(
            reqs.column("prompt_len").to_pylist(),
            reqs.column("output_len").to_pylist(),
            strict=True,
        )
    ) == sorted(PROMPTS)


def _recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=TIMEOUT))


def _until_ended(ws: ClientConnection) -> list[dict[str, Any]]:
    out = []
    while (msg := _recv(ws)).get("replay", {}).get("state") != "ended":
        out.append(msg)
    return out


def test_replay_at_speed_zero_sends_every_step_once_in_order(recorded: Recorded) -> None:
    stored = recorded.get(f"/api/sessions/{recorded.session}/steps", limit=10000).json()["steps"]
    with recorded.ws(f"/ws/replay/{recorded.session}?speed=0") as ws:
        msgs = _until_ended(ws)
    assert msgs == stored  # the /ws/telemetry format: the recorded StepTelemetry records
    with recorded.ws(f"/ws/replay/{recorded.session}?speed=0&from=5&every=2&fields=kv") as ws:
        msgs = _until_ended(ws)
    assert [m["step"] for m in msgs] == [s["step"] for s in stored[6::2]]
    assert all(set(m) == {"step", "kv"} for m in msgs)


def test_replay_controls_pause_seek_speed_resume(recorded: Recorded) -> None:
    with recorded.ws(f"/ws/replay/{recorded.session}?speed=0.0001") as ws:
        assert _recv(ws)["step"] == 0  # the first step is due at once, the next in hours
        ws.send(json.dumps({"op": "pause"}))
        assert _recv(ws)["replay"]["state"] == "paused"
        ws.send(json.dumps({"op": "jump"}))
        assert "op" in _recv(ws)["error"]
        ws.send(json.dumps({"op": "seek", "step": 10}))
        assert _recv(ws)["replay"]["state"] == "paused"
        ws.send(json.dumps({"op": "speed", "speed": 0}))
        assert _recv(ws)["replay"]["speed"] == 0
        ws.send(json.dumps({"op": "resume"}))
        assert _recv(ws)["replay"]["state"] == "playing"
        steps = [m["step"] for m in _until_ended(ws)]
        assert steps == list(range(10, steps[-1] + 1)) and len(steps) > 3
        ws.send(json.dumps({"op": "seek", "step": 2}))
        assert _recv(ws)["replay"]["state"] == "playing"
        assert _recv(ws)["step"] == 2


@pytest.mark.parametrize(
    ("path", "code", "word"),
    [
        ("/ws/replay/nope", 404, "nope"),
        ("/ws/replay/{id}?speed=-1", 422, "speed"),
        ("/ws/replay/{id}?from=x", 422, "from"),
        ("/ws/replay/{id}?fields=bogus", 422, "fields"),
    ],
)
def test_replay_refuses_bad_requests(recorded: Recorded, path: str, code: int, word: str) -> None:
    with recorded.ws(path.format(id=recorded.session)) as ws:
        msg = _recv(ws)
        assert msg["code"] == code and word in msg["error"]
        ws.recv_events_thread.join(TIMEOUT)
        assert ws.close_code == 1008


@pytest.fixture(scope="module")
def rerun(recorded: Recorded) -> str:
    """A rerun of the recorded session, finished (its requests counted in /metrics)."""
    served_before = _requests_served(recorded)
    # slowed down, so that it still runs when the second POST comes, however busy the machine
    resp = httpx.post(recorded.url + f"/api/sessions/{recorded.session}/rerun?speed=0.05")
    assert resp.status_code == 202, resp.text
    new = resp.json()["session"]
    again = httpx.post(recorded.url + f"/api/sessions/{recorded.session}/rerun")
    assert again.status_code == 409 and new in again.json()["error"]["message"]
    wait_for(
        lambda: recorded.get(f"/api/sessions/{new}").json().get("ended_t") is not None,
        timeout=60,
        what="the rerun to finish",
    )
    assert _recorder(recorded.served).flush()
    assert _requests_served(recorded) == served_before + len(PROMPTS)
    return new


def _requests_served(recorded: Recorded) -> float:
    """moescope:request_success_total summed over finish reasons."""
    text = recorded.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("moescope:request_success_total{")
    )


def test_a_rerun_is_a_linked_session_with_the_same_request_trace(
    recorded: Recorded, rerun: str
) -> None:
    info = recorded.get(f"/api/sessions/{rerun}").json()
    assert info["parent"] == recorded.session and info["kind"] == "rerun"
    assert info["rerun"]["finished"] == len(PROMPTS) and info["rerun"]["failed"] == 0
    assert info["knobs"]["max_num_seqs"] == 6  # the knobs in force when it started
    assert info["steps"] > 0 and not info["recording"]
    original = recorded.get(f"/api/sessions/{recorded.session}").json()
    assert rerun in original["reruns"] and original["recording"]
    reqs = recorded.get(f"/api/sessions/{rerun}/requests").json()["requests"]
    assert sorted((r["prompt_len"], r["output_len"]) for r in reqs) == sorted(PROMPTS)
    steps = recorded.get(f"/api/sessions/{rerun}/steps").json()["steps"]
    assert {s["session"] for s in steps} == {rerun}
    assert sum(s["queue"]["finished"] for s in steps) == len(PROMPTS)


def test_label_and_delete(recorded: Recorded, rerun: str) -> None:
    resp = httpx.post(recorded.url + f"/api/sessions/{rerun}/label", json={"label": "fcfs x6"})
    assert resp.status_code == 200
    labels = {s["id"]: s["label"] for s in recorded.get("/api/sessions").json()["sessions"]}
    assert labels[rerun] == "fcfs x6"
    resp = httpx.delete(recorded.url + f"/api/sessions/{recorded.session}")
    assert resp.status_code == 409  # being recorded
    assert httpx.delete(recorded.url + f"/api/sessions/{rerun}").status_code == 200
    assert recorded.get(f"/api/sessions/{rerun}").status_code == 404
    assert recorded.get(f"/api/sessions/{rerun}/steps").status_code == 404
    assert rerun not in recorded.get(f"/api/sessions/{recorded.session}").json()["reruns"]


def test_status_and_telemetry_carry_the_recorder_counts(recorded: Recorded) -> None:
    rec, loop = _recorder(recorded.served), recorded.served.loop
    wait_for(lambda: rec.flush() and rec.written_steps == loop.steps, what="recording")
    stats = recorded.get("/api/status").json()["recorder"]
    assert stats["recording"] and stats["ok"] and stats["dropped_steps"] == 0
    assert stats["written_steps"] == loop.steps and stats["pending_steps"] == 0
    with telemetry_ws(recorded.served, "?fields=queue,recorder") as (ws, _):
        seqs = loop.knobs.max_num_seqs % 64 + 1  # a change, so the idle loop steps
        loop.update_knobs({"max_num_seqs": seqs}).result(TIMEOUT)
        msg = _recv(ws)
    assert set(msg) == {"step", "queue", "recorder"}
    assert msg["recorder"] == {"ok": True, "dropped": 0, "pending": msg["recorder"]["pending"]}
