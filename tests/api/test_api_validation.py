"""Bad input is always a 4xx naming the field, and the server keeps serving afterwards."""

import httpx
import pytest
from api_servers import KV_BLOCKS, MODEL, Served

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

CASES = [
    (
        "post",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": "many"},
        "max_tokens",
    ),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 5}, "temperature"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, "n"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "bogus": 1}, "bogus"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": [1, "a"]}, "prompt"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "stop": 5}, "stop"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x" * 600}, "prompt"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    (
        "post",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "presence_penalty": 1.0},
        "presence_penalty",
    ),
    ("post", "/v1/completions", {"model": MODEL}, "prompt"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
    ("post", "/v1/completions", [1, 2], "body"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "stop": ""}, "stop"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a", ""]}, "stop"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**64}, "seed"),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "x", "seed": -(2**63) - 1}, "seed"),
    ("post", "/v1/chat/completions", {**CHAT, "stop": ""}, "stop"),
    ("post", "/v1/chat/completions", {**CHAT, "seed": 2**64}, "seed"),
    (
        "post",
        "/v1/chat/completions",
        {**CHAT, "max_completion_tokens": 10**9},
        "max_completion_tokens",
    ),
    ("post", "/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, "max_tokens"),
    ("post", "/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
    (
        "post",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]},
        "messages[0].role",
    ),
    (
        "post",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function"}],
        },
        "tools",
    ),
    ("patch", "/api/knobs", {"max_num_seqs": 0}, "max_num_seqs"),
    ("patch", "/api/knobs", {"max_num_seqs": "8"}, "max_num_seqs"),
    ("patch", "/api/knobs", {"policy": "random"}, "policy"),
    ("patch", "/api/knobs", {"kv_watermark": 0.9}, "kv_watermark"),
    ("patch", "/api/knobs", {"kv_capacity_blocks": KV_BLOCKS + 1}, "kv_capacity_blocks"),
    (
        "patch",
        "/api/knobs",
        {"max_num_seqs": 300, "max_num_batched_tokens": 256},
        "max_num_batched_tokens",
    ),
    ("patch", "/api/knobs", {"prefill_chunk_size": 512}, "prefill_chunk_size"),
    ("patch", "/api/knobs", {"speed": "fast"}, "speed"),
    ("patch", "/api/knobs", {}, None),
    ("patch", "/api/knobs", "max_num_seqs=8", "body"),
]


@pytest.fixture(scope="module")
def http(served: Served) -> httpx.Client:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "body", "field"), CASES)
def test_bad_input_is_a_422_naming_the_field(
    http: httpx.Client, method: str, path: str, body: object, field: str | None
) -> None:
    resp = http.request(method.upper(), path, json=body)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    if field is not None:
        assert error["param"] == field, error
        assert field in error["message"]


def test_knob_errors_name_the_allowed_range(http: httpx.Client) -> None:
    msg = http.patch("/api/knobs", json={"max_num_seqs": 5000}).json()["error"]["message"]
    assert "max_num_seqs" in msg and "[1, 4096]" in msg
    msg = http.patch("/api/knobs", json={"policy": "x"}).json()["error"]["message"]
    assert "fcfs, priority, shortest_first" in msg


@pytest.mark.parametrize("raw", [b'{"model": ', b"not json", b'{"model": "a",}'])
def test_malformed_json_is_a_422(http: httpx.Client, raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = http.post(path, content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 422, resp.text
        assert "malformed JSON" in resp.json()["error"]["message"]
    resp = http.patch("/api/knobs", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 422


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"[1, 2]", "JSON object, not an array"),
        (b"null", "JSON object, not null"),
        (b'"prompt"', "JSON object, not a string"),
        (b"", "body is empty"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b'{"model": "\xff"}', "not valid UTF-8"),
        (b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
        (b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 4301 + b"}", "4300 digits"),
    ],
)
def test_a_body_that_is_no_json_object_is_a_422_saying_why(
    http: httpx.Client, raw: bytes, words: str
) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = http.post(path, content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["param"] == "body" and words in error["message"], error


def test_a_json_body_without_its_content_type_is_told_so(http: httpx.Client) -> None:
    resp = http.post("/v1/completions", content=b'{"model": "x", "prompt": "x"}')
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["param"] == "body" and "content-type: application/json" in error["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_seeds_are_those_the_generator_takes(http: httpx.Client, path: str) -> None:
    body = {"model": MODEL, "prompt": "x"} if path == "/v1/completions" else CHAT
    for seed in (-(2**63), 2**64 - 1):
        resp = http.post(path, json={**body, "seed": seed, "max_tokens": 2, "temperature": 1.0})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] >= 1
    for seed in (-(2**63) - 1, 2**64, 10**100):
        resp = http.post(path, json={**body, "seed": seed})
        assert resp.status_code == 422
        error = resp.json()["error"]
        assert error["param"] == "seed" and "[-2**63, 2**64 - 1]" in error["message"], error


def test_other_client_errors(http: httpx.Client) -> None:
    resp = http.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
    resp = http.post(
        "/v1/completions", content=b"x" * (65 * 1024), headers={"content-type": "application/json"}
    )
    assert resp.status_code == 413
    assert http.get("/nowhere").status_code == 404


def test_openai_fields_that_are_ignored_are_accepted(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 2,
        "user": "u",
        "n": 1,
        "frequency_penalty": 0,
        "logit_bias": {},
        "metadata": {"k": "v"},
        "echo": False,
        "best_of": 1,
        "logprobs": None,
    }
    assert http.post("/v1/completions", json=body).status_code == 200


def test_server_still_serves_after_bad_input(http: httpx.Client, served: Served) -> None:
    for method, path, body, _ in CASES:
        http.request(method.upper(), path, json=body)
    resp = http.post("/v1/completions", json={"model": MODEL, "prompt": "still", "max_tokens": 3})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    knobs = http.get("/api/knobs").json()
    assert knobs["knobs"]["max_num_seqs"] == 8
    assert served.loop.alive
