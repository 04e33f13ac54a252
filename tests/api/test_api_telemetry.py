"""WS /ws/telemetry: fields, step continuity, decimation, filters, and slow clients."""

import json
import socket
from typing import Any

import pytest
from api_servers import Served, traffic, wait_idle, ws_connect
from websockets.sync.client import ClientConnection

from engine.telemetry import StepTelemetry


def _recv(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def _until_idle(ws: ClientConnection) -> list[dict[str, Any]]:
    """Messages until one shows an empty engine."""
    out = []
    while True:
        msg = _recv(ws)
        out.append(msg)
        q = msg.get("queue")
        if q is not None and q["running"] == q["waiting"] == q["swapped"] == 0:
            return out


def test_one_record_per_step_with_every_field(served: Served) -> None:
    with ws_connect(served.ws_url) as ws:
        traffic(served.loop, 4, 24)
        msgs = _until_idle(ws)
    assert len(msgs) >= 24
    for msg in msgs:
        assert set(StepTelemetry.model_fields) <= set(msg)
        assert "dropped" not in msg
        StepTelemetry.model_validate({k: v for k, v in msg.items() if k != "dropped"})
    steps = [m["step"] for m in msgs]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    first = msgs[0]
    assert first["v"] == 1 and first["session"] == served.loop.engine.session
    assert first["kv"]["total"] == served.loop.engine.blocks.total
    assert first["experts"]["layers"] == len(first["experts"]["counts"])
    assert sum(m["queue"]["finished"] for m in msgs) == 4
    assert sum(len(m["latency"]["ttft_ms"]) for m in msgs) == 4


def _drain_raw(ws: ClientConnection) -> list[str]:
    """Every message sent so far (the engine is idle, so nothing more is coming)."""
    out = []
    while True:
        try:
            out.append(str(ws.recv(timeout=0.5)))
        except TimeoutError:
            return out


def _drain(ws: ClientConnection) -> list[dict[str, Any]]:
    return [json.loads(m) for m in _drain_raw(ws)]


def test_every_and_fields_filter(served: Served) -> None:
    with ws_connect(served.ws_url + "?every=3&fields=kv,queue") as ws:
        traffic(served.loop, 2, 30)
        wait_idle(served.loop)
        msgs = _drain(ws)
    assert msgs and all(set(m) == {"step", "kv", "queue"} for m in msgs)
    steps = [m["step"] for m in msgs]
    assert all(s % 3 == 0 for s in steps)
    assert steps == list(range(steps[0], steps[-1] + 1, 3))


def test_bundles_carry_every_step_in_order(served: Served) -> None:
    with (
        ws_connect(served.ws_url + "?bundle=1&fields=queue") as ws,
        ws_connect(served.ws_url + "?fields=queue") as plain,
    ):
        traffic(served.loop, 4, 40)
        wait_idle(served.loop)
        bundles = [json.loads(m) for m in _drain_raw(ws)]
        singles = _drain(plain)
    assert bundles and all(isinstance(b, list) and b for b in bundles)
    assert any(len(b) > 1 for b in bundles)  # steps come several to a message
    assert [f for b in bundles for f in b] == singles
    steps = [m["step"] for m in singles]
    assert steps == list(range(steps[0], steps[0] + len(steps)))


@pytest.mark.parametrize("query", ["?every=0", "?every=x", "?fields=kv,nope", "?bundle=2"])
def test_bad_query_is_refused_with_a_message(served: Served, query: str) -> None:
    with ws_connect(served.ws_url + query) as ws:
        msg = _recv(ws)
        assert "error" in msg and query[1:].split("=")[0] in msg["error"]
        ws.recv_events_thread.join(5)
        assert ws.close_code == 1008


@pytest.mark.slow
def test_slow_client_drops_for_itself_only(served: Served) -> None:
    """One client never reads: the engine and another client go on, the slow one loses steps."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 17)  # no autotuning to MBs
    sock.connect(("127.0.0.1", served.server.port))
    with (
        ws_connect(served.ws_url, sock=sock, max_queue=2, compression=None) as slow,
        ws_connect(served.ws_url) as fast,
    ):
        steps_before = served.loop.steps
        traffic(served.loop, 8, 400)
        msgs = _until_idle(fast)
        wait_idle(served.loop)
        steps = [m["step"] for m in msgs]
        assert len(steps) >= 400
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        assert not any("dropped" in m for m in msgs)
        assert served.loop.steps - steps_before >= 400  # the engine never waited for `slow`
        late = _drain(slow)
    got = [m["step"] for m in late]
    dropped = sum(m.get("dropped", 0) for m in late)
    assert dropped > 0
    assert len(got) + dropped == len(steps)
    assert got[-1] == steps[-1]
