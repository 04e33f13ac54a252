"""/api/status, GET/PATCH /api/knobs (reflected in telemetry) and the knob history."""

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from api_servers import KV_BLOCKS, MODEL, TIMEOUT, Served, telemetry_ws, traffic, wait_idle

from engine.outputs import RequestDelta


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield client
        client.patch("/api/knobs", json={"max_num_seqs": 8, "policy": "fcfs"})


def test_status_reports_model_configs_knobs_queue_and_kv(http: httpx.Client) -> None:
    s = http.get("/api/status").json()
    assert s["model"] == MODEL
    assert s["model_config"]["num_experts"] == 8 and s["model_config"]["max_model_len"] == 1024
    assert s["engine_config"]["cache"]["num_blocks"] == KV_BLOCKS
    assert s["engine_config"]["dtype"] == "float32"
    assert s["knobs"]["max_num_seqs"] == 8 and s["knobs_version"] >= 1
    assert set(s["queue"]) == {"waiting", "running", "swapped"}
    assert s["kv"]["total"] == KV_BLOCKS and 0.0 <= s["kv"]["usage"] <= 1.0
    assert s["loop"]["alive"] is True and s["loop"]["error"] is None
    assert s["limits"] == {
        "max_prompt_tokens": 512,
        "max_tokens": 1000,
        "max_prompts": 16,
        "max_body_bytes": 64 * 1024,
    }


def test_get_knobs_gives_values_version_and_ranges(http: httpx.Client) -> None:
    k = http.get("/api/knobs").json()
    assert k["knobs"]["policy"] == "fcfs" and k["version"] >= 1
    schema = k["schema"]
    assert schema["max_num_seqs"]["minimum"] == 1 and schema["max_num_seqs"]["maximum"] == 4096
    assert schema["policy"]["enum"] == ["fcfs", "priority", "shortest_first"]
    assert schema["kv_capacity_blocks"]["maximum"] == KV_BLOCKS
    assert schema["kv_capacity_blocks"]["nullable"] is True
    assert schema["expert_capacity_factor"]["exclusive_minimum"] == 0.0
    assert schema["kv_watermark"]["allowed"] == "[0.0, 0.5]"


def test_patch_is_versioned_and_reflected_in_telemetry(
    http: httpx.Client, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued, resume = threading.Event(), threading.Event()
    real = served.loop.update_knobs

    def spy(*args: Any, **kwargs: Any) -> Any:
        future = real(*args, **kwargs)
        queued.set()
        return future

    monkeypatch.setattr(served.loop, "update_knobs", spy)

    def hold(_: RequestDelta) -> None:
        """The engine waits in its first step (so the traffic is far from done) until the
        change is queued; it applies the change before its next step."""
        resume.wait(TIMEOUT)

    with (
        telemetry_ws(served, "?fields=knobs_version,batch,knob_changes") as (ws, _),
        ThreadPoolExecutor(1) as pool,
    ):
        traffic(served.loop, 8, 60, on_output=hold)
        try:
            patched = pool.submit(
                http.patch,
                "/api/knobs?origin=test-suite",
                json={"max_num_seqs": 3, "policy": "shortest_first"},
            )
            assert queued.wait(TIMEOUT)
        finally:
            resume.set()
        resp = patched.result()
        assert resp.status_code == 200, resp.text
        body = resp.json()
        version = body["version"]
        assert body["knobs"]["max_num_seqs"] == 3 and body["knobs"]["policy"] == "shortest_first"
        while True:
            msg = json.loads(ws.recv(timeout=TIMEOUT))
            if msg["knobs_version"] >= version:
                break
            assert msg["batch"]["max_slots"] == 8
        assert msg["knobs_version"] == version
        assert msg["batch"]["max_slots"] == 3 and len(msg["batch"]["slots"]) <= 3
        assert msg["knob_changes"][-1]["changes"]["max_num_seqs"] == [8, 3]
        nxt = json.loads(ws.recv(timeout=TIMEOUT))
        assert nxt["batch"]["max_slots"] == 3 and len(nxt["batch"]["slots"]) <= 3
        wait_idle(served.loop)
    history = http.get("/api/knobs/history").json()["changes"]
    last = next(c for c in history if c["version"] == version)
    assert last["origin"] == "test-suite"
    assert last["changes"] == {"max_num_seqs": [8, 3], "policy": ["fcfs", "shortest_first"]}
    assert http.get("/api/knobs").json()["version"] == version


def test_patch_on_an_idle_engine_applies_at_once(http: httpx.Client, served: Served) -> None:
    wait_idle(served.loop)
    version = http.patch("/api/knobs", json={"max_num_seqs": 5}).json()["version"]
    s = http.get("/api/status").json()
    assert s["knobs_version"] == version
    assert s["applied_knobs_version"] == version
    assert served.loop.engine.knobs.max_num_seqs == 5
