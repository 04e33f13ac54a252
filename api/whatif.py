"""What-if endpoints: POST /api/whatif (a candidate knob set against the current one, in the
twin) and GET /api/whatif/scorecard (applied knob changes, predicted and observed)."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from api.control import check_knob_types, live_knob_schema
from api.errors import APIError
from api.sessions import require_store
from engine.errors import InvalidInput
from engine.loop import EngineDead
from server.scorecard import KEEP, Scorecard
from server.state import state_of
from server.twins import Twins
from storage import SessionNotFound
from storage import scorecard as db

router = APIRouter()

MAX_HORIZON_S = 600.0
MAX_SESSIONS = 8  # recorded sessions one twin pools
MAX_ID = 40


class WhatIfBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    knobs: dict[str, Any]
    # "live", a session id, or several sessions of one engine to pool (the first's trace)
    source: str | list[str]
    horizon_s: Annotated[float, Field(gt=0, le=MAX_HORIZON_S)] = 60.0


@router.post("/api/whatif")
async def whatif(request: Request, body: WhatIfBody) -> dict[str, Any]:
    """Current and candidate knobs side by side in the twin, each metric a median with an 80%
    band over several simulations, the saturation, the fit and the wall time."""
    twins: Twins = state_of(request.app).twins
    if not body.knobs:
        raise APIError(422, 'no knobs given; send {"knobs": {"max_num_seqs": 8}, ...}', "knobs")
    check_knob_types(body.knobs, live_knob_schema(state_of(request.app).engine_loop))
    sessions = source_sessions(body.source)
    try:
        if sessions == ["live"]:
            return await twins.live(body.knobs, body.horizon_s)
        if "live" in sessions:
            raise APIError(422, "live cannot be pooled with recorded sessions", "source")
        require_store(request)
        return await twins.recorded(sessions, body.knobs, body.horizon_s)
    except InvalidInput as exc:
        raise APIError(422, str(exc), exc.param) from None
    except SessionNotFound as exc:
        raise APIError(404, str(exc), "source") from None
    except EngineDead as exc:
        raise APIError(503, str(exc)) from None


def source_sessions(source: str | list[str]) -> list[str]:
    """The sessions a what-if's `source` names; APIError (422, `source`) unless it is one id
    or 1 to MAX_SESSIONS of them, each 1 to MAX_ID characters."""
    sessions = [source] if isinstance(source, str) else source
    if not 1 <= len(sessions) <= MAX_SESSIONS:
        raise APIError(422, f"source: one session id or a list of 1 to {MAX_SESSIONS}", "source")
    if any(not 1 <= len(s) <= MAX_ID for s in sessions):
        raise APIError(422, f"source: each session id is 1 to {MAX_ID} characters", "source")
    return sessions


@router.get("/api/whatif/scorecard")
async def scorecard(
    request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> dict[str, Any]:
    """Applied knob changes, newest first: the twin's prediction, the observation, the errors."""
    card: Scorecard = state_of(request.app).scorecard
    base = {"session": card.session, "horizon_s": card.horizon_s}
    if card.store is None:
        return {
            **base,
            "stored": False,
            "note": f"no session database: the newest {KEEP} entries since this server "
            "started, kept in memory",
            "entries": list(card.entries)[:limit],
        }
    entries = await asyncio.to_thread(db.entries, card.store, limit)
    return {**base, "stored": True, "entries": entries}
