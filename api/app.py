"""The FastAPI app around a running EngineLoop: `create_app(engine_loop, settings)`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api import control, experts, metrics, openai_routes, replay_ws, sessions, telemetry_ws
from api.auth import GuardMiddleware
from api.errors import install_error_handlers
from api.metrics import Metrics
from api.sessions import open_storage, session_meta
from api.settings import ServerSettings
from engine.loop import EngineLoop


def create_app(engine_loop: EngineLoop, settings: ServerSettings | None = None) -> FastAPI:
    """Routes, auth, metrics and the session recorder around `engine_loop` (started here if needed).

    The caller owns the loop and stops it after the server is done. Opening the database
    raises storage.StorageError (IncompatibleSchema for another schema version).
    """
    settings = settings or ServerSettings()
    store, recorder = open_storage(engine_loop, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if recorder is not None:
            recorder.start(
                engine_loop.engine.session, **session_meta(engine_loop, settings.model_name)
            )
        engine_loop.start()
        task = None
        if app.state.metrics is not None:
            task = asyncio.create_task(app.state.metrics.run(settings.metrics_interval_s))
        try:
            yield
        finally:
            tasks = [t for t in (task, app.state.rerun.task if app.state.rerun else None) if t]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if recorder is not None:
                await asyncio.to_thread(recorder.close)
            if store is not None:
                store.close()

    app = FastAPI(title="moescope", version="0.1.0", lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.state.settings = settings
    app.state.metrics = Metrics(engine_loop, settings.model_name) if settings.metrics else None
    app.state.store = store
    app.state.recorder = recorder
    app.state.rerun = None
    install_error_handlers(app)
    for module in (openai_routes, control, experts, telemetry_ws, metrics, sessions, replay_ws):
        app.include_router(module.router)
    app.add_middleware(
        GuardMiddleware,
        api_key=settings.api_key,
        admin_key=settings.admin_key,
        max_body_bytes=settings.max_body_bytes,
    )
    return app
