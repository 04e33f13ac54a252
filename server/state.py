"""The services one server process runs, held in one typed object on `app.state.server`."""

from collections import deque
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
from tuning.twin.fit_rows import FitRows


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
        window, card, pilot = self.window, self.scorecard, self.autopilot.pilot
        bounded: dict[str, deque[Any]] = {
            "window_routed_steps": window.routed,
            "window_counted_steps": window.counts,
            "window_ended_requests": window.records,
            "window_attributable_steps": window.attributable,
            "scorecard_entries": card.entries,
            "scorecard_unpredicted": card.unpredicted,
            "scorecard_due": card.due,
            "knob_history": self.engine_loop.engine.knob_versions.history,
            "autopilot_decisions": pilot.decisions,
            "autopilot_history": pilot.history,
        }
        fanout = self.telemetry_fanout  # made by the first client
        return {
            **{name: {"size": len(q), "limit": q.maxlen or 0} for name, q in bounded.items()},
            "twin_fit_rows": {"size": len(window.fit_rows), "limit": FitRows.LIMIT},
            "telemetry_clients": {
                "size": len(fanout.clients) if fanout is not None else 0,
                "limit": MAX_TELEMETRY_CLIENTS,
            },
        }


def state_of(app: Any) -> ServerState:
    """The services of the app (a FastAPI app made by api.app.create_app)."""
    state: ServerState = app.state.server
    return state
