"""API keys guard every endpoint (websockets too); knob changes can need a separate admin key."""

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from api_servers import MODEL, TIMEOUT, Served, serve, stop, telemetry_ws, ws_connect
from websockets.exceptions import ConnectionClosedError

from cli.main import build_parser
from server.settings import ServerSettings

KEY, ADMIN = "sk-test-key", "sk-admin-key"
REFUSAL = "missing or invalid API key (Authorization: Bearer <key>)"
ENDPOINTS = [
    ("GET", "/v1/models"),
    ("GET", "/api/status"),
    ("GET", "/api/knobs"),
    ("GET", "/api/knobs/history"),
    ("GET", "/metrics"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("PATCH", "/api/knobs"),
    ("GET", "/docs"),
]


@pytest.fixture(scope="module")
def guarded() -> Iterator[Served]:
    s = serve(ServerSettings(model_name=MODEL, api_key=KEY, admin_key=ADMIN))
    yield s
    stop(s)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_the_key(guarded: Served, method: str, path: str) -> None:
    for headers in ({}, _auth("wrong"), {"Authorization": KEY}):
        resp = httpx.request(method, guarded.url + path, headers=headers, json={})
        assert resp.status_code == 401, (path, headers)
        assert resp.json()["error"]["type"] == "authentication_error"
        assert resp.headers["www-authenticate"] == "Bearer"


def test_the_key_opens_them(guarded: Served) -> None:
    for path in ("/v1/models", "/api/status", "/metrics", "/api/knobs/history"):
        assert httpx.get(guarded.url + path, headers=_auth(KEY)).status_code == 200
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert out.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_knob_changes_need_the_admin_key(guarded: Served) -> None:
    url = guarded.url + "/api/knobs"
    assert httpx.patch(url, json={"max_num_seqs": 4}).status_code == 401
    resp = httpx.patch(url, json={"max_num_seqs": 4}, headers=_auth(KEY))
    assert resp.status_code == 403 and "admin" in resp.json()["error"]["message"]
    assert httpx.patch(url, json={"max_num_seqs": 4}, headers=_auth(ADMIN)).status_code == 200
    assert httpx.get(url, headers=_auth(ADMIN)).json()["knobs"]["max_num_seqs"] == 4


def test_websocket_needs_the_key_as_header_or_query(guarded: Served) -> None:
    for url, headers in (
        (guarded.ws_url, None),
        (guarded.ws_url + "?token=wrong", None),
        (guarded.ws_url, _auth("wrong")),
    ):
        with ws_connect(url, additional_headers=headers) as ws:
            assert json.loads(ws.recv(timeout=TIMEOUT)) == {"error": REFUSAL, "code": 401}
            with pytest.raises(ConnectionClosedError) as info:
                ws.recv(timeout=TIMEOUT)
        assert info.value.rcvd is not None
        assert (info.value.rcvd.code, info.value.rcvd.reason) == (1008, REFUSAL)
    for seqs, (query, headers) in enumerate(((f"?token={KEY}&every=1", None), ("", _auth(KEY))), 5):
        with telemetry_ws(guarded, query, additional_headers=headers) as (ws, _):
            # a change makes a step
            guarded.loop.update_knobs({"max_num_seqs": seqs}).result(TIMEOUT)
            assert "step" in json.loads(ws.recv(timeout=TIMEOUT))


def test_default_bind_is_loopback() -> None:
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"


def test_rebalancing_needs_the_admin_key(guarded: Served) -> None:
    url = guarded.url + "/api/experts/rebalance"
    resp = httpx.post(url, json={}, headers=_auth(KEY))
    assert resp.status_code == 403 and "admin" in resp.json()["error"]["message"]
    resp = httpx.post(url, json={}, headers=_auth(ADMIN))
    assert resp.status_code == 409 and "ep_size is 1" in resp.json()["error"]["message"]


def test_a_browser_on_another_origin_may_read_with_the_key(guarded: Served) -> None:
    """The dashboard's charts fetch from the dashboard's origin: the preflight needs no key,
    the read still does, and changes are not offered cross-origin."""
    origin = {"Origin": "http://dashboard.test:8501"}
    preflight = httpx.options(
        guarded.url + "/api/autopilot",
        headers={
            **origin,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    read = httpx.get(guarded.url + "/api/autopilot", headers={**origin, **_auth(KEY)})
    assert read.status_code == 200 and read.headers["access-control-allow-origin"] == "*"
    refused = httpx.get(guarded.url + "/api/autopilot", headers=origin)
    assert refused.status_code == 401  # the browser reads the refusal too
    assert refused.headers["access-control-allow-origin"] == "*"
    change = httpx.options(
        guarded.url + "/api/knobs",
        headers={**origin, "Access-Control-Request-Method": "PATCH"},
    )
    assert change.status_code == 400
