"""TelemetryStream: ring buffer, drop count, connection states and reconnecting by itself."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from api_servers import wait_for
from websockets.sync.server import Server, ServerConnection, serve

from dashboard.stream import CONNECTED, GONE, RECONNECTING, TelemetryStream
from engine.ep.ranks import free_port


@contextmanager
def _server(port: int, first_step: int) -> Iterator[Server]:
    """Sends steps first_step.. (the third one with `dropped: 2`): five one a message, then
    five as one bundle (the eighth with `dropped: 1`); then waits."""

    def frame(i: int) -> dict[str, int]:
        dropped = {first_step + 2: 2, first_step + 7: 1}.get(i)
        return {"step": i, **({"dropped": dropped} if dropped else {})}

    def handler(ws: ServerConnection) -> None:
        for i in range(first_step, first_step + 5):
            ws.send(json.dumps(frame(i)))
        ws.send(json.dumps([frame(i) for i in range(first_step + 5, first_step + 10)]))
        for _ in ws:
            pass

    with serve(handler, "127.0.0.1", port) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server
        server.shutdown()
        thread.join()


class _RecordedStates(TelemetryStream):
    """A stream that keeps every state it goes through (some last only `gone_after_s`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "state":
            self.__dict__.setdefault("states", []).append(value)
        super().__setattr__(name, value)


def test_buffer_drops_and_reconnect_after_a_server_restart() -> None:
    port = free_port()
    stream = _RecordedStates(
        f"ws://127.0.0.1:{port}/ws/telemetry", maxlen=8, gone_after_s=0.5, max_backoff_s=0.2
    )
    try:
        with _server(port, 0):
            stream.start()
            wait_for(lambda: stream.received == 10, what="ten frames")
            assert stream.state == CONNECTED and stream.dropped == 3
            assert [f["step"] for f in stream.frames()] == list(range(2, 10))
            assert not any("dropped" in f for f in stream.frames())
        wait_for(lambda: stream.state == GONE, what="server gone")
        states = stream.states
        changes = [s for i, s in enumerate(states) if not i or s != states[i - 1]]
        assert changes[-3:] == [CONNECTED, RECONNECTING, GONE]
        with _server(port, 100):
            wait_for(lambda: stream.received == 20, what="frames after the restart")
            assert stream.state == CONNECTED and stream.dropped == 6
            assert stream.frames()[-1]["step"] == 109
    finally:
        stream.stop()
