"""GET/PUT /api/autopilot: the SLO autopilot's settings, state and recent decisions."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from pydantic import ValidationError

from api.errors import APIError, describe_errors
from engine.errors import InvalidInput
from server.autopilot_runner import AutopilotRunner
from server.state import state_of
from tuning.autopilot.pilot import HISTORY
from tuning.autopilot.settings import AutopilotSettings

router = APIRouter()


@router.get("/api/autopilot")
def get_autopilot(
    request: Request, history: Annotated[int, Query(ge=0, le=HISTORY)] = 300
) -> dict[str, Any]:
    """Settings, state (off, waiting, holding, adjusting, rolled back, paused) with why, the
    decisions newest first, each with its reason, and the last `history` measurements."""
    runner: AutopilotRunner = state_of(request.app).autopilot
    return runner.status(history)


@router.put("/api/autopilot")
def put_autopilot(request: Request, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """Change some settings (the rest stay): enable, targets, knobs and bounds, pacing."""
    runner: AutopilotRunner = state_of(request.app).autopilot
    try:
        settings = AutopilotSettings.model_validate({**runner.settings.model_dump(), **body})
    except ValidationError as exc:
        raise APIError(422, *settings_error(exc)) from None
    runner.configure(settings)
    return runner.status()


def settings_error(exc: ValidationError) -> tuple[str, str | None]:
    """The message and the field: pydantic's, or the one a cross-field rule names."""
    message, param = describe_errors(exc.errors())
    for err in exc.errors():
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, InvalidInput) and cause.param:
            loc = [str(part) for part in err["loc"]]
            return message, ".".join([*loc, cause.param] if cause.param == "lo" else [cause.param])
    return message, param
