"""Running the what-if twin for the server: from a recorded session or from the live engine,
one simulation at a time, in the analysis process (server/analysis.py: never on a thread of the
server, whose GIL the engine thread needs at every torch operation)."""

import asyncio
import time
from dataclasses import replace
from typing import Any

from engine.loop import EngineLoop
from engine.queue_snapshot import QueueSnapshot
from server.analysis import Analysis
from server.engine_info import engine_description
from server.live_window import LiveWindow
from storage import Store
from storage import queries as q
from tuning.twin.bands import DRAWS
from tuning.twin.cost_model import Rows, stack
from tuning.twin.experts import Routing
from tuning.twin.live import arrival_window, twin_from_live
from tuning.twin.whatif import Recording, twin_from_recordings


class Twins:
    """What-ifs of one server: `recorded` reads a session from `store`, `live` starts from the
    engine's queue (a snapshot taken on the engine thread) and its recent `window`."""

    def __init__(
        self, engine_loop: EngineLoop, window: LiveWindow, store: Store | None, analysis: Analysis
    ) -> None:
        self.engine_loop = engine_loop
        self.window = window
        self.store = store
        self.analysis = analysis
        self.lock = asyncio.Lock()  # simulations share the CPU with the engine: one at a time

    async def recorded(
        self, session_ids: list[str], changes: dict[str, Any], horizon_s: float
    ) -> dict[str, Any]:
        """Twin.compare on recorded sessions of one engine: the first one's trace and knobs,
        the cost model pooled over all (SessionNotFound, InvalidInput as raised)."""
        store = self.store
        assert store is not None
        async with self.lock:  # read under the lock: callers waiting in line hold no copy
            recordings = [await asyncio.to_thread(q.recording, store, sid) for sid in session_ids]
            run = self.analysis.submit(_recorded, session_ids, recordings, changes, horizon_s)
            return await asyncio.wrap_future(run)

    async def live(
        self,
        changes: dict[str, Any],
        horizon_s: float,
        version: int | None = None,
        draws: int = DRAWS,
    ) -> dict[str, Any]:
        """Twin.compare from the live engine as it stands, with the approximations made; the
        current side under the knobs in force at `version` (default: now). Raises InvalidInput
        (`source`) with too few steps, EngineDead when the engine is gone."""
        async with self.lock:  # copied under the lock: callers waiting in line hold no copy
            self.window.drain()
            routing = self.window.routing()
            # only the changes after `version` are undone to reach its knobs
            since = self.engine_loop.engine.applied_knobs_version if version is None else version
            snapshot = await asyncio.wrap_future(self.engine_loop.snapshot(since))
            recent = list(self.window.records)
            window_s = arrival_window(snapshot.t - self.window.started_t)
            config = engine_description(self.engine_loop)
            rows = stack(self.window.fit_rows.rows())
            args = (config, routing, rows, recent, snapshot, window_s, changes, horizon_s)
            run = self.analysis.submit(_live, *args, version, draws)
            return await asyncio.wrap_future(run)


def _recorded(
    session_ids: list[str],
    recordings: list[Recording],
    changes: dict[str, Any],
    horizon_s: float,
) -> dict[str, Any]:
    start = time.perf_counter()
    twin = twin_from_recordings(recordings)
    result = twin.compare(changes, horizon_s)
    source = session_ids[0] if len(session_ids) == 1 else session_ids
    return {"source": source, "horizon_s": horizon_s, **result, "wall_s": _since(start)}


def _live(
    config: dict[str, Any],
    routing: Routing,
    rows: Rows,
    recent: list[dict[str, Any]],
    snapshot: QueueSnapshot,
    window_s: float,
    changes: dict[str, Any],
    horizon_s: float,
    version: int | None,
    draws: int,
) -> dict[str, Any]:
    start = time.perf_counter()
    twin, notes = twin_from_live(
        config, routing, rows, recent, snapshot, window_s, horizon_s, version
    )
    result = replace(twin, num_draws=draws).compare(changes, horizon_s)
    return {
        "source": "live",
        "horizon_s": horizon_s,
        "t": snapshot.t,
        **result,
        "approximations": notes,
        "wall_s": _since(start),
    }


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 4)
