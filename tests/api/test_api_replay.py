"""WS /ws/replay: every answer to a control message names the step that will be sent next."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from api_servers import MODEL, Served, serve, stop, traffic, wait_for, wait_idle, ws_connect
from websockets.sync.client import ClientConnection

from server.settings import ServerSettings
from server.state import state_of


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server that recorded one request of 30 steps into a fresh SQLite database."""
    db = tmp_path_factory.mktemp("db") / "moescope.db"
    served = serve(ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}"))
    traffic(served.loop, 1, 30)
    wait_idle(served.loop)
    recorder = state_of(served.server.server.config.app).recorder
    wait_for(
        lambda: recorder.flush() and recorder.written_steps == served.loop.steps,
        what="the recording",
    )
    yield served
    stop(served)


def _replay(served: Served) -> ClientConnection:
    """Steps 1 and later are due hours after step 0 at this speed."""
    path = f"/ws/replay/{served.loop.engine.session}?speed=0.0001"
    return ws_connect(served.url.replace("http://", "ws://") + path)


def _send(ws: ClientConnection, **control: Any) -> dict[str, Any]:
    """Send a control message; its answer."""
    ws.send(json.dumps(control))
    return json.loads(ws.recv(timeout=20))["replay"]


def _recv_step(ws: ClientConnection) -> int:
    return json.loads(ws.recv(timeout=20))["step"]


def test_every_control_answer_names_the_next_step(recorded: Served) -> None:
    last = recorded.loop.steps - 1
    assert last >= 20
    with _replay(recorded) as ws:
        assert _recv_step(ws) == 0
        assert _send(ws, op="pause") == {
            "session": recorded.loop.engine.session,
            "state": "paused",
            "speed": 0.0001,
            "next": 1,
        }
        assert _send(ws, op="seek", step=12) == {
            "session": recorded.loop.engine.session,
            "state": "paused",
            "speed": 0.0001,
            "next": 12,
        }
        assert _send(ws, op="speed", speed=0.0002)["next"] == 12
        assert _send(ws, op="resume")["next"] == 12
        assert _recv_step(ws) == 12  # due at once after the resume
        assert _send(ws, op="seek", step=5)["next"] == 5
        assert _recv_step(ws) == 5
        assert _send(ws, op="seek", step=last + 100) == {
            "session": recorded.loop.engine.session,
            "state": "ended",
            "speed": 0.0002,
            "next": None,
        }
        assert _send(ws, op="seek", step=last) == {
            "session": recorded.loop.engine.session,
            "state": "playing",
            "speed": 0.0002,
            "next": last,
        }
        assert _recv_step(ws) == last
        assert json.loads(ws.recv(timeout=20))["replay"]["state"] == "ended"
        assert _send(ws, op="speed", speed=1) == {
            "session": recorded.loop.engine.session,
            "state": "ended",
            "speed": 1,
            "next": None,
        }
