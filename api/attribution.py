"""Latency attribution: each request's TTFT and E2E split by cause, and a window's shares by
cause, live (/api/requests/{id}/timeline, /api/attribution) and for recorded sessions
(/api/sessions/{sid}/requests/{rid}/timeline, /api/sessions/{sid}/attribution).

The work runs in the thread pool, never on the event loop, and reads no engine state: only
the live window's copies of the telemetry and the database."""

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from api.errors import APIError
from api.sessions import require_store, session_not_found
from engine.errors import InvalidInput
from server.live_attribution import TimelineMissing, live_report, live_timeline
from server.live_window import AttributionView, LiveWindow
from server.session_attribution import BUCKET_S, RECENT, session_report, session_timeline
from server.state import state_of
from storage import SessionNotFound

router = APIRouter()

MAX_SPAN_S = 86_400.0
WINDOW_S = 60.0  # the live report's default window
BucketS = Annotated[float, Query(gt=0, le=MAX_SPAN_S)]
Recent = Annotated[int, Query(ge=0, le=1000)]


@router.get("/api/requests/{request_id}/timeline")
async def request_timeline(request: Request, request_id: str) -> dict[str, Any]:
    """An ended request's latencies split by cause, from the live window."""
    view = _view(request)
    recorder = state_of(request.app).recorder
    try:
        return await asyncio.to_thread(live_timeline, view, request_id, recorder)
    except TimelineMissing as e:
        raise APIError(404, str(e), "request_id") from e


@router.get("/api/attribution")
async def attribution(
    request: Request,
    window_s: Annotated[float, Query(gt=0, le=MAX_SPAN_S)] = WINDOW_S,
    bucket_s: BucketS = BUCKET_S,
    recent: Recent = RECENT,
) -> dict[str, Any]:
    """The shares by cause of the requests that ended in the last `window_s` seconds."""
    view = _view(request)
    return await asyncio.to_thread(live_report, view, window_s, bucket_s, recent)


def _view(request: Request) -> AttributionView:
    """The live window, brought up to date and copied (on the event loop, which it belongs to)."""
    window: LiveWindow = state_of(request.app).window
    window.drain()
    return window.attribution_view()


@router.get("/api/sessions/{session_id}/requests/{request_id}/timeline")
def session_request_timeline(request: Request, session_id: str, request_id: str) -> dict[str, Any]:
    """A recorded request's latencies split by cause."""
    store = require_store(request)
    with _refused(session_id):
        out = session_timeline(store, session_id, request_id)
    if out is None:
        raise APIError(404, f"no request {request_id!r} in session {session_id!r}", "request_id")
    return out


@router.get("/api/sessions/{session_id}/attribution")
def session_attribution(
    request: Request,
    session_id: str,
    start: Annotated[float | None, Query(alias="from", ge=0)] = None,
    end: Annotated[float | None, Query(alias="to", ge=0)] = None,
    bucket_s: BucketS = BUCKET_S,
    recent: Recent = RECENT,
) -> dict[str, Any]:
    """The shares by cause of the recorded requests that ended between from and to (unix s)."""
    if start is not None and end is not None and start > end:
        raise APIError(422, f"from: must not exceed to (from={start}, to={end})", "from")
    store = require_store(request)
    with _refused(session_id):
        return session_report(store, session_id, start, end, bucket_s, recent)


@contextlib.contextmanager
def _refused(session_id: str) -> Iterator[None]:
    """An unknown session as a 404; one recorded before attribution could read it as a 422."""
    try:
        yield
    except SessionNotFound:
        raise session_not_found(session_id) from None
    except InvalidInput as exc:
        raise APIError(422, str(exc), exc.param) from None
