"""The FastAPI app around a running EngineLoop: `create_app(loop, settings)`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api import control, metrics, openai_routes, telemetry_ws
from api.auth import GuardMiddleware
from api.errors import install_error_handlers
from api.metrics import Metrics
from api.settings import ServerSettings
from engine.loop import EngineLoop


def create_app(loop: EngineLoop, settings: ServerSettings | None = None) -> FastAPI:
    """Routes, auth and metrics around `loop` (started here if it is not running yet).

    The caller owns the loop and stops it after the server is done.
    """
    settings = settings or ServerSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        task = None
        if app.state.metrics is not None:
            task = asyncio.create_task(app.state.metrics.run(settings.metrics_interval_s))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    app = FastAPI(title="moescope", version="0.1.0", lifespan=lifespan)
    app.state.loop = loop
    app.state.settings = settings
    app.state.metrics = Metrics(loop, settings.model_name) if settings.metrics else None
    install_error_handlers(app)
    for module in (openai_routes, control, telemetry_ws, metrics):
        app.include_router(module.router)
    app.add_middleware(GuardMiddleware, api_key=settings.api_key, admin_key=settings.admin_key,
                       max_body_bytes=settings.max_body_bytes)
    return app
