"""WS /ws/telemetry: fields, step continuity, decimation, filters, and slow clients."""

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from api_servers import TIMEOUT, Served, telemetry_ws, traffic, wait_idle, ws_connect
from websockets.sync.client import ClientConnection

from engine.telemetry import StepTelemetry


def _recv(ws: ClientConnection, timeout: float = TIMEOUT) -> dict[str, Any]:
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
    wait_idle(served.loop)
    with telemetry_ws(served) as (ws, _):
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
    assert first["v"] == 2 and first["session"] == served.loop.engine.session
    assert first["kv"]["total"] == served.loop.engine.blocks.total
    assert first["experts"]["layers"] == len(first["experts"]["counts"])
    assert sum(m["queue"]["finished"] for m in msgs) == 4
    assert sum(len(m["latency"]["ttft_ms"]) for m in msgs) == 4


def _last_step(served: Served) -> int:
    """The number of the engine's latest step (it is idle)."""
    return served.loop.steps - 1


def _through(ws: ClientConnection, last: int) -> list[Any]:
    """Messages (decoded) until the one that carries step `last` or a later one."""
    out = []
    while True:
        out.append(_recv(ws))
        frames = out[-1] if isinstance(out[-1], list) else [out[-1]]
        if frames[-1]["step"] >= last:
            return out


def test_every_and_fields_filter(served: Served) -> None:
    with telemetry_ws(served, "?every=3&fields=kv,queue") as (ws, _):
        wait_idle(served.loop)
        first = served.loop.steps  # the client gets every step from this one on
        traffic(served.loop, 2, 30)
        wait_idle(served.loop)
        last = _last_step(served)
        msgs = _through(ws, last - last % 3)
    assert msgs and all(set(m) == {"step", "kv", "queue"} for m in msgs)
    steps = [m["step"] for m in msgs]
    assert all(s % 3 == 0 for s in steps)
    assert steps == list(range(first + (-first) % 3, last + 1, 3))


@contextmanager
def _event_loop_held(served: Served) -> Iterator[None]:
    """The server's event loop runs nothing inside the block (the engine goes on): whatever
    the engine publishes meanwhile waits in the fan-out, to go out at once afterwards."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(TIMEOUT)

    aloop: asyncio.AbstractEventLoop = served.server.server.servers[0].get_loop()
    aloop.call_soon_threadsafe(hold)
    assert held.wait(TIMEOUT)
    try:
        yield
    finally:
        release.set()


def test_bundles_carry_every_step_in_order(served: Served) -> None:
    with (
        telemetry_ws(served, "?bundle=1&fields=queue") as (ws, _),
        telemetry_ws(served, "?fields=queue") as (plain, _),
    ):
        wait_idle(served.loop)
        first = served.loop.steps
        with _event_loop_held(served):  # every step of the traffic is queued when sending
            traffic(served.loop, 4, 40)
            wait_idle(served.loop)
        last = _last_step(served)
        bundles = _through(ws, last)
        singles = _through(plain, last)
    assert bundles and all(isinstance(b, list) and b for b in bundles)
    assert any(len(b) > 1 for b in bundles)  # steps come several to a message
    assert [f for b in bundles for f in b] == singles
    assert [m["step"] for m in singles] == list(range(first, last + 1))


@pytest.mark.parametrize("query", ["?every=0", "?every=x", "?fields=kv,nope", "?bundle=2"])
def test_bad_query_is_refused_with_a_message(served: Served, query: str) -> None:
    with ws_connect(served.ws_url + query) as ws:
        msg = _recv(ws)
        assert "error" in msg and query[1:].split("=")[0] in msg["error"]
        ws.recv_events_thread.join(TIMEOUT)
        assert ws.close_code == 1008


@pytest.mark.slow
def test_slow_client_drops_for_itself_only(served: Served) -> None:
    """One client never reads: the engine and another client go on, the slow one loses steps."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 17)  # no autotuning to MBs
    sock.connect(("127.0.0.1", served.server.port))
    with (
        telemetry_ws(served, sock=sock, max_queue=2, compression=None) as (slow, slow_queue),
        telemetry_ws(served) as (fast, _),
    ):
        wait_idle(served.loop)
        first = served.loop.steps
        # Traffic until the server has dropped steps for `slow`: its socket's buffers are
        # full, and nothing empties them while it does not read.
        rounds = 0
        while not slow_queue.dropped:
            assert rounds < 20, "the server never dropped a step for the client that never reads"
            traffic(served.loop, 8, 100)
            wait_idle(served.loop)  # the engine never waited for `slow`
            rounds += 1
        last = _last_step(served)
        assert last - first + 1 >= 100 * rounds
        msgs = _through(fast, last)
        steps = [m["step"] for m in msgs]
        assert steps == list(range(first, last + 1))
        assert not any("dropped" in m for m in msgs)
        late = _through(slow, last)
    got = [m["step"] for m in late]
    dropped = sum(m.get("dropped", 0) for m in late)
    assert dropped > 0
    assert len(got) + dropped == len(steps)
    assert got[0] == first and got[-1] == last
