"""Expert placement endpoints: GET /api/experts, POST /api/experts/rebalance."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from api.errors import APIError
from engine.errors import InvalidInput, Refused
from engine.loop import EngineDead, EngineLoop
from server.state import state_of

router = APIRouter()


class RebalanceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    window: int = Field(64, ge=1, le=4096, description="recent steps whose expert loads count")
    replicas: int = Field(0, ge=0, le=1024, description="redundant replicas of hot experts")


@router.get("/api/experts")
async def placement(request: Request) -> dict[str, Any]:
    """Which experts each rank hosts, per layer, and how the all-to-all is known."""
    engine_loop: EngineLoop = state_of(request.app).engine_loop
    p = engine_loop.engine.placement
    return {
        "ep_size": p.ep_size,
        "mode": engine_loop.engine.a2a_mode,
        "version": p.version,
        "placement": p.hosted(),
        "moe_layers": engine_loop.engine.model_config.moe_layers,  # real index of each row
    }


@router.post("/api/experts/rebalance")
async def rebalance(
    request: Request, body: Annotated[RebalanceRequest | None, Body()] = None
) -> dict[str, Any]:
    """New placement from the last `window` steps' expert loads, switched between two steps."""
    engine_loop: EngineLoop = state_of(request.app).engine_loop
    body = body or RebalanceRequest()
    try:
        return await asyncio.wrap_future(engine_loop.rebalance(body.window, body.replicas))
    except EngineDead as exc:
        raise APIError(503, str(exc)) from None
    except Refused as exc:
        raise APIError(409, str(exc), exc.param) from None
    except InvalidInput as exc:
        raise APIError(422, str(exc), exc.param) from None
