"""The services one server process runs, held in one typed object on `state_of(app).server`."""

from dataclasses import dataclass
from typing import Any

from engine.loop import EngineLoop
from server.autopilot_runner import AutopilotRunner
from server.live_window import LiveWindow
from server.metrics import Metrics
from server.rerun import Rerun
from server.scorecard import Scorecard
from server.settings import ServerSettings
from server.telemetry_fanout import MAX_CLIENTS as MAX_TELEMETRY_CLIENTS
from server.telemetry_fanout import TelemetryFanout
from server.twins import Twins
from storage import Recorder, Store


@dataclass
class ServerState:
    engine_loop: EngineLoop
    settings: ServerSettings
    window: LiveWindow
    twins: Twins
    scorecard: Scorecard
    autopilot: AutopilotRunner
    metrics: Metrics | None = None  # None with --no-metrics
    store: Store | None = None  # None with --no-record
    recorder: Recorder | None = None
    fit_from: dict[str, Any] | None = None  # what seeded the live twin (--fit-from)
    rerun: Rerun | None = None  # the latest rerun of a recorded session
    telemetry_fanout: TelemetryFanout | None = None  # made by the first telemetry client

    def sizes(self) -> dict[str, dict[str, int]]:
        """Every structure that grows with steps, requests, knob changes or connections: its
        length now and the limit it never passes (older entries go; the database keeps them)."""
        fanout = self.telemetry_fanout  # made by the first client
        history = self.engine_loop.engine.knob_versions.history
        return {
            **self.window.sizes(),
            **self.scorecard.sizes(),
            "knob_history": {"size": len(history), "limit": history.maxlen or 0},
            **self.autopilot.pilot.sizes(),
            "telemetry_clients": {
                "size": len(fanout.clients) if fanout is not None else 0,
                "limit": MAX_TELEMETRY_CLIENTS,
            },
        }


def state_of(app: Any) -> ServerState:
    """The services of the app (a FastAPI app made by api.app.create_app)."""
    state: ServerState = app.state.server
    return state
