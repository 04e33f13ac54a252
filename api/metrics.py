"""GET /metrics: the Prometheus exposition of server.metrics.Metrics."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.errors import APIError
from server.metrics import Metrics
from server.state import state_of

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text."""
    m: Metrics | None = state_of(request.app).metrics
    if m is None:
        raise APIError(404, "metrics are off (server started with --no-metrics)")
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
