"""A client that goes away mid-request aborts it, and its KV blocks are freed at once."""

import json
import socket
from collections.abc import Callable, Iterator

import httpx
import pytest
from api_servers import MODEL, Served, serve, stop, wait_for, wait_idle
from prometheus_client.parser import text_string_to_metric_families

from server.settings import ServerSettings


@pytest.fixture(scope="module")
def fresh() -> Iterator[Served]:
    """A server of its own: knobs and traffic left by other tests cannot hold this KV back."""
    s = serve(ServerSettings(model_name=MODEL, max_tokens_limit=1000))
    yield s
    stop(s)


def _abort_spy(served: Served, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the engine's step count at each abort the server makes."""
    calls: list[int] = []
    real = served.loop.abort

    def spy(request_id: str) -> None:
        calls.append(served.loop.steps)
        real(request_id)

    monkeypatch.setattr(served.loop, "abort", spy)
    return calls


def test_stream_disconnect_frees_kv_within_a_step(
    fresh: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = fresh
    wait_idle(served.loop)
    aborts = _abort_spy(served, monkeypatch)
    body = {
        "model": MODEL,
        "prompt": "x" * 100,
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=served.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()  # kept open: closing it would disconnect now
            chunks = 0
            while chunks < 5:
                chunks += next(lines).startswith("data: ")
            (request_id,) = served.loop.engine.requests
            assert http.get("/api/status").json()["kv"]["used"] > 0
            assert not aborts
        wait_for(lambda: request_id not in served.loop.engine.requests, what="the abort")
        assert http.get("/api/status").json()["kv"]["used"] == 0
        assert len(aborts) == 1
        assert served.loop.steps - aborts[0] <= 1  # freed before the next step ran
        status = http.get("/api/status").json()
        assert status["queue"]["running"] == 0 and status["loop"]["streams"] == 0
        abort_line = 'moescope:request_success_total{finished_reason="abort"'
        assert abort_line in http.get("/metrics").text


def _post_and_leave(served: Served, body: dict, until: Callable[[], bool], what: str) -> None:
    """POST a completion, wait until `until()` holds (the server has the request), then
    close the connection without reading the answer."""
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", served.server.port)) as sock:
        sock.sendall(head.encode() + payload)
        wait_for(until, what=what)


def test_non_streaming_disconnect_aborts_too(
    fresh: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = fresh
    wait_idle(served.loop)
    aborts = _abort_spy(served, monkeypatch)
    body = {"model": MODEL, "prompt": "y" * 20, "max_tokens": 1000, "ignore_eos": True}
    _post_and_leave(served, body, lambda: bool(served.loop.engine.requests), "the request")
    wait_for(lambda: not served.loop.engine.requests, what="the abort")
    assert len(aborts) == 1 and served.loop.steps - aborts[0] <= 1
    assert served.loop.engine.blocks.num_used == 0


def _counters(http: httpx.Client) -> dict[str, float]:
    """Request counters of /metrics: aborts, prompt and generated tokens."""
    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.labels.get("finished_reason") == "abort":
                out["aborts"] = sample.value
            elif sample.name in (
                "moescope:prompt_tokens_total",
                "moescope:generation_tokens_total",
            ):
                out[sample.name.split(":")[1]] = sample.value
    return {"aborts": 0.0, **out}


def test_requests_aborted_while_waiting_are_counted(fresh: Served) -> None:
    served = fresh
    wait_idle(served.loop)
    running = {
        "model": MODEL,
        "prompt": "hold",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    queued = {"model": MODEL, "prompt": "queued", "max_tokens": 5}
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "queued"}],
        "max_tokens": 5,
        "stream": True,
    }
    with httpx.Client(base_url=served.url, timeout=30) as http:
        assert http.patch("/api/knobs", json={"max_num_seqs": 1}).status_code == 200
        try:
            before = _counters(http)
            with http.stream("POST", "/v1/completions", json=running) as resp:
                lines = resp.iter_lines()  # kept open: it holds the only batch slot
                assert next(lines).startswith("data: ")
                _post_and_leave(
                    served,
                    queued,
                    lambda: served.loop.summary()["queue"]["waiting"] == 1,
                    "the queued request",
                )
                wait_for(lambda: served.loop.summary()["queue"]["waiting"] == 0, what="its abort")
                with (
                    http.stream("POST", "/v1/completions", json={**queued, "stream": True}),
                    http.stream("POST", "/v1/chat/completions", json=chat),
                ):
                    wait_for(
                        lambda: served.loop.summary()["queue"]["waiting"] == 2,
                        what="two queued streams",
                    )
                wait_for(
                    lambda: _counters(http)["aborts"] == before["aborts"] + 3,
                    what="three aborts counted",
                )
                wait_for(
                    lambda: served.loop.summary()["queue"]["waiting"] == 0,
                    what="the queue to empty",
                )
                assert served.loop.summary()["queue"]["running"] == 1
                # never scheduled: no prompt tokens served, none generated
                assert _counters(http) == {**before, "aborts": before["aborts"] + 3}
            wait_for(
                lambda: _counters(http)["aborts"] == before["aborts"] + 4,
                what="the running request's abort counted",
            )
        finally:
            assert http.patch("/api/knobs", json={"max_num_seqs": 8}).status_code == 200
