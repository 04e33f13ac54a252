"""The server's recorder when its database stops taking writes mid-run, and when it returns."""

import json
from pathlib import Path

import httpx
from api_servers import MODEL, serve, stop, telemetry_ws
from sqlalchemy import func, select
from storage_helpers import TIMEOUT, locked, mark_step, run_requests, wait_for

from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder
from storage.models import SessionRow, StepRow


def test_outage_drops_and_counts_then_recording_resumes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outage.db'}"
    served = serve(
        ServerSettings(model_name=MODEL, db_url=url, record_buffer=16, db_timeout_s=0.05)
    )
    rec: Recorder = state_of(served.server.server.config.app).recorder
    try:
        run_requests(served.loop, 2, 8)
        assert rec.flush()
        with locked(url), telemetry_ws(served, "?fields=recorder") as (ws, _):
            run_requests(served.loop, 4, 60)
            wait_for(lambda: rec.dropped_steps > 0 and not rec.ok, what="drops while locked")
            status = httpx.get(served.url + "/api/status").json()["recorder"]
            assert not status["ok"] and "locked" in status["last_error"]
            assert status["dropped_steps"] > 0 and status["pending_steps"] <= 16
            last = mark_step(served.loop)
            while (msg := json.loads(ws.recv(timeout=TIMEOUT)))["step"] < last:
                pass
            assert msg["recorder"]["ok"] is False and msg["recorder"]["dropped"] > 0
        assert rec.flush()  # the database is back: what was kept is written
        run_requests(served.loop, 2, 8)
        mark_step(served.loop)
        assert rec.flush()
        status = httpx.get(served.url + "/api/status").json()["recorder"]
        assert status["ok"] and status["dropped_steps"] == rec.dropped_steps
        with rec.store.engine.connect() as conn:
            stored = conn.execute(select(func.count()).select_from(StepRow)).scalar()
            last = conn.execute(select(func.max(StepRow.step))).scalar()
            dropped = conn.execute(select(SessionRow.dropped)).scalar()
        assert stored + rec.dropped_steps == served.loop.steps
        assert last == served.loop.steps - 1 and dropped == rec.dropped_steps
    finally:
        stop(served)
