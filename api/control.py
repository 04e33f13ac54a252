"""Control endpoints: /api/status, GET/PATCH /api/knobs, /api/knobs/history."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request

from api.errors import APIError
from engine.errors import InvalidInput
from engine.knobs import knob_schema
from engine.loop import EngineDead, EngineLoop
from server.autopilot_runner import AUTOPILOT_ORIGIN
from server.engine_info import engine_description
from server.state import state_of

router = APIRouter()

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
}


def check_knob_types(changes: dict[str, Any], schema: dict[str, dict[str, Any]]) -> None:
    """Strict JSON types (no "8" for 8, no true for 1); pydantic checks ranges afterwards."""
    for name, value in changes.items():
        entry = schema.get(name)
        if entry is None or (value is None and entry["nullable"]):
            continue
        types = JSON_TYPES.get(entry.get("type", ""), (object,))
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise APIError(
                422, f"{name}: expected {entry['type']} {entry['allowed']}, got {value!r}", name
            )


def live_knob_schema(engine_loop: EngineLoop) -> dict[str, dict[str, Any]]:
    """`knob_schema` of the live engine (its allocated blocks bound kv_capacity_blocks)."""
    return knob_schema(engine_loop.engine.blocks.total)


@router.get("/api/status")
async def status(request: Request) -> dict[str, Any]:
    """Configs, knobs and versions, queue and KV summary, expert parallel, limits, recorder, loop
    health, bounded structures' sizes."""
    state = state_of(request.app)
    engine_loop, settings, recorder = state.engine_loop, state.settings, state.recorder
    max_len = engine_loop.engine.model_config.max_model_len
    return {
        "model": settings.model_name,
        "session": engine_loop.engine.session,
        **engine_description(engine_loop),
        "limits": {
            "max_prompt_tokens": min(settings.max_prompt_tokens or max_len, max_len - 1),
            "max_tokens": settings.max_tokens_limit or max_len,
            "max_prompts": settings.max_prompts,
            "max_body_bytes": settings.max_body_bytes,
        },
        "auth": {
            "api_key": settings.api_key is not None,
            "admin_key": settings.admin_key is not None,
        },
        "metrics": state.metrics is not None,
        "recorder": recorder.stats() if recorder is not None else {"recording": False},
        "fit_from": state.fit_from,
        "sizes": state.sizes(),  # each bounded structure's length and limit
        **engine_loop.summary(),
    }


@router.get("/api/knobs")
async def get_knobs(request: Request) -> dict[str, Any]:
    """The knobs, their version and applied version, and each knob's schema."""
    engine_loop: EngineLoop = state_of(request.app).engine_loop
    s = engine_loop.summary()
    return {
        "knobs": s["knobs"],
        "version": s["knobs_version"],
        "applied_version": s["applied_knobs_version"],
        "schema": live_knob_schema(engine_loop),
    }


@router.patch("/api/knobs")
async def patch_knobs(
    request: Request,
    changes: Annotated[dict[str, Any], Body()],
    origin: Annotated[str, Query(min_length=1, max_length=64)] = "api",
) -> dict[str, Any]:
    """Validate the change as a whole; it applies at the next step boundary."""
    engine_loop: EngineLoop = state_of(request.app).engine_loop
    if origin == AUTOPILOT_ORIGIN:
        raise APIError(
            422,
            f"origin: {origin!r} is kept for the autopilot's own changes; name who makes this one",
            "origin",
        )
    schema = live_knob_schema(engine_loop)
    if not changes:
        raise APIError(422, 'no knobs given; send a JSON object like {"max_num_seqs": 8}')
    check_knob_types(changes, schema)
    try:
        version = await asyncio.wrap_future(engine_loop.update_knobs(changes, origin))
    except InvalidInput as exc:
        raise APIError(422, str(exc), exc.param) from None
    except EngineDead as exc:
        raise APIError(503, str(exc)) from None
    return {
        "version": version,
        "knobs": engine_loop.knobs.model_dump(),
        "applied_version": engine_loop.engine.applied_knobs_version,
    }


@router.get("/api/knobs/history")
async def knob_history(request: Request) -> dict[str, Any]:
    """Applied knob changes, oldest first: version, time, origin, {field: [old, new]}."""
    return {"changes": state_of(request.app).engine_loop.knob_history()}
