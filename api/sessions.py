"""Recorded sessions: list, read, label, delete, export, rerun (/api/sessions...).

Database reads run in the thread pool (plain `def` routes), never on the event loop.
"""

import asyncio
import io
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.errors import APIError
from engine.loop import EngineLoop
from server.engine_info import engine_description
from server.rerun import Rerun, run_rerun
from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder, SessionNotFound, Store
from storage import queries as q
from storage.export import iter_jsonl, write_parquet
from tuning.twin.trace import trace_of

router = APIRouter()

SessionId = Annotated[str, Field(min_length=1, max_length=40)]


def open_storage(
    engine_loop: EngineLoop, settings: ServerSettings
) -> tuple[Store | None, Recorder | None]:
    """The session database and (unless recording is off) a recorder on the loop's buses."""
    if settings.db_url is None:
        return None, None
    store = Store(settings.db_url, timeout_s=settings.db_timeout_s)
    if not settings.record:
        return store, None
    return store, Recorder(
        store, engine_loop.bus, engine_loop.requests, max_pending=settings.record_buffer
    )


def session_meta(engine_loop: EngineLoop, model_name: str) -> dict[str, Any]:
    """A session row's description of the live engine: model, configs, knobs now."""
    return {
        "model": model_name,
        "engine_session": engine_loop.engine.session,
        "config": engine_description(engine_loop),
        "knobs": engine_loop.knobs.model_dump(),
        "knobs_version": engine_loop.engine.knobs_version,
    }


def require_store(request: Request) -> Store:
    store: Store | None = state_of(request.app).store
    if store is None:
        raise APIError(503, "no session database: start the server with --db URL")
    return store


def session_not_found(session_id: str) -> APIError:
    return APIError(404, f"no session {session_id!r}", "session_id")


def _require(store: Store, session_id: str) -> None:
    try:
        q.require_session(store, session_id)
    except SessionNotFound:
        raise session_not_found(session_id) from None


@router.get("/api/sessions")
def list_sessions(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    replica: Annotated[str | None, Query(max_length=100)] = None,
    fleet_run: Annotated[str | None, Query(max_length=100)] = None,
) -> dict[str, Any]:
    """Newest first, with duration, steps, requests, model and the knobs at start; only a
    fleet replica's or a fleet run's with `replica` or `fleet_run`."""
    recorder: Recorder | None = state_of(request.app).recorder
    store = require_store(request)
    return {
        "sessions": q.list_sessions(store, limit, offset, replica=replica, fleet_run=fleet_run),
        "recording": recorder.current_session if recorder else None,
    }


@router.get("/api/sessions/{session_id}")
def get_session(request: Request, session_id: str) -> dict[str, Any]:
    """One session's summary, configs, reruns and request stats."""
    try:
        out = q.get_session(require_store(request), session_id)
    except SessionNotFound:
        raise session_not_found(session_id) from None
    rerun: Rerun | None = state_of(request.app).rerun
    recorder: Recorder | None = state_of(request.app).recorder
    out["recording"] = recorder is not None and session_id == recorder.current_session
    if rerun is not None and rerun.session == session_id:
        out["rerun"] = rerun.progress()
    return out


@router.get("/api/sessions/{session_id}/steps")
def get_steps(
    request: Request,
    session_id: str,
    start: Annotated[int | None, Query(alias="from", ge=0)] = None,
    end: Annotated[int | None, Query(alias="to", ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=q.MAX_STEPS_PER_QUERY)] = 1000,
    every: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> dict[str, Any]:
    """Telemetry records with from <= step <= to; `next` is where a following page starts."""
    if start is not None and end is not None and start > end:
        raise APIError(422, f"from: must not exceed to (from={start}, to={end})", "from")
    store = require_store(request)
    _require(store, session_id)
    steps = q.steps(store, session_id, start, end, limit, every)
    more = len(steps) == limit and (end is None or steps[-1]["step"] < end)
    return {"session": session_id, "steps": steps, "next": steps[-1]["step"] + 1 if more else None}


@router.get("/api/sessions/{session_id}/knob_changes")
def get_knob_changes(request: Request, session_id: str) -> dict[str, Any]:
    """The session's applied knob changes."""
    store = require_store(request)
    _require(store, session_id)
    return {"session": session_id, "knob_changes": q.knob_changes(store, session_id)}


@router.get("/api/sessions/{session_id}/requests")
def get_requests(request: Request, session_id: str) -> dict[str, Any]:
    """The session's request records."""
    store = require_store(request)
    _require(store, session_id)
    return {"session": session_id, "requests": q.requests(store, session_id)}


@router.delete("/api/sessions/{session_id}")
def delete_session(request: Request, session_id: str) -> dict[str, Any]:
    """Remove a session and its records."""
    recorder: Recorder | None = state_of(request.app).recorder
    if recorder is not None and session_id in (recorder.main_session, recorder.current_session):
        raise APIError(409, f"session {session_id!r} is being recorded", "session_id")
    try:
        q.delete_session(require_store(request), session_id)
    except SessionNotFound:
        raise session_not_found(session_id) from None
    return {"deleted": session_id}


class LabelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: Annotated[str, Field(max_length=200)] | None


@router.post("/api/sessions/{session_id}/label")
def label_session(request: Request, session_id: str, body: LabelBody) -> dict[str, Any]:
    """Name a session (null or "" clears the name)."""
    label = body.label or None
    try:
        q.set_label(require_store(request), session_id, label)
    except SessionNotFound:
        raise session_not_found(session_id) from None
    return {"session": session_id, "label": label}


@router.get("/api/sessions/{session_id}/export", response_model=None)
def export_session(
    request: Request,
    session_id: str,
    format: Literal["jsonl", "parquet"] = "jsonl",
    table: Literal["steps", "requests", "knob_changes"] = "steps",
) -> Response:
    """JSONL: every record of the session, typed; Parquet: one table (`table`)."""
    store = require_store(request)
    _require(store, session_id)
    name = f"moescope-{session_id}"
    if format == "jsonl":
        return StreamingResponse(
            iter_jsonl(store, session_id),
            media_type="application/x-ndjson",
            headers=_attachment(f"{name}.jsonl"),
        )
    buf = io.BytesIO()
    write_parquet(store, session_id, buf, table)
    return Response(
        buf.getvalue(),
        media_type="application/vnd.apache.parquet",
        headers=_attachment(f"{name}-{table}.parquet"),
    )


def _attachment(filename: str) -> dict[str, str]:
    return {"content-disposition": f'attachment; filename="{filename}"'}


@router.post("/api/sessions/{session_id}/rerun", status_code=202)
async def rerun_session(
    request: Request,
    session_id: str,
    speed: Annotated[float, Query(gt=0, le=1000)] = 1.0,
) -> dict[str, Any]:
    """Replay the session's request trace on the live engine as a new, linked session."""
    state = state_of(request.app)
    store, recorder = require_store(request), state.recorder
    if recorder is None:
        raise APIError(409, "recording is off (--no-record): a rerun could not be recorded")
    if state.rerun is not None and not state.rerun.done:
        raise APIError(409, f"rerun {state.rerun.session!r} is still running")
    try:
        records = await asyncio.to_thread(q.requests, store, session_id, with_prompts=True)
        if not records:
            await asyncio.to_thread(q.require_session, store, session_id)
    except SessionNotFound:
        raise session_not_found(session_id) from None
    if not records:
        raise APIError(
            422, f"session {session_id!r} has no recorded requests to rerun", "session_id"
        )
    engine_loop = state.engine_loop
    new = recorder.begin_session(
        "rerun",
        parent_id=session_id,
        label=f"rerun of {session_id}",
        **session_meta(engine_loop, state.settings.model_name),
    )
    rerun = Rerun(new, session_id, trace_of(records), speed)
    rerun.task = asyncio.create_task(run_rerun(rerun, engine_loop, recorder))
    state.rerun = rerun
    return rerun.progress()
