"""The FastAPI app around a running EngineLoop: `create_app(engine_loop, settings)`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from api import (
    attribution,
    autopilot,
    control,
    experts,
    metrics,
    openai_routes,
    replay_ws,
    sessions,
    telemetry_ws,
    whatif,
)
from api.auth import GuardMiddleware
from api.errors import install_error_handlers
from api.sessions import open_storage, session_meta
from engine.loop import EngineLoop
from server.analysis import Analysis
from server.autopilot_runner import AutopilotRunner
from server.fit_seed import seed
from server.live_window import LiveWindow
from server.metrics import Metrics
from server.scorecard import Scorecard
from server.settings import ServerSettings
from server.state import ServerState
from server.twins import Twins
from tuning.twin.live import ARRIVAL_WINDOW_S

WINDOW_DRAIN_S = 0.1  # how often the live window takes in new steps (and sees knob changes)


def create_app(engine_loop: EngineLoop, settings: ServerSettings | None = None) -> FastAPI:
    """Routes, auth, metrics and the session recorder around `engine_loop` (started here if needed).

    The caller owns the loop and stops it after the server is done. Opening the database
    raises storage.StorageError (IncompatibleSchema for another schema version); seeding the
    live twin (`settings.fit_from`) SessionNotFound or InvalidInput.
    """
    settings = settings or ServerSettings()
    store, recorder = open_storage(engine_loop, settings)
    window = LiveWindow(engine_loop, keep_s=max(ARRIVAL_WINDOW_S, settings.whatif_horizon_s) + 10)
    fit_from = None
    if settings.fit_from is not None:
        try:
            fit_from = seed(window, store, settings.fit_from, engine_loop)
        except BaseException:
            if store is not None:
                store.close()
            raise
    # the server's simulations, off its GIL; the modules of the functions it runs
    analysis = Analysis(preload=("server.twins", "server.autopilot_runner"))
    twins = Twins(engine_loop, window, store, analysis)
    scorecard = Scorecard(twins, window, engine_loop.engine.session, settings.whatif_horizon_s)
    pilot = AutopilotRunner(engine_loop, window, settings.autopilot, analysis)
    window.change_hooks += [scorecard.watch, pilot.knob_changed]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if recorder is not None:
            recorder.start(
                engine_loop.engine.session, **session_meta(engine_loop, settings.model_name)
            )
        window.subscribe()
        engine_loop.start()
        task = None
        if state.metrics is not None:
            task = asyncio.create_task(state.metrics.run(settings.metrics_interval_s))
        window_task = asyncio.create_task(window.run(WINDOW_DRAIN_S))
        pilot_task = asyncio.create_task(pilot.run())
        try:
            yield
        finally:
            rerun = state.rerun.task if state.rerun else None
            tasks = [t for t in (task, window_task, pilot_task, rerun) if t]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await scorecard.close()
            await asyncio.to_thread(analysis.close)
            if recorder is not None:
                await asyncio.to_thread(recorder.close)
            if store is not None:
                store.close()

    app = FastAPI(title="moescope", version="0.1.0", lifespan=lifespan)
    state = ServerState(
        engine_loop=engine_loop,
        settings=settings,
        window=window,
        twins=twins,
        scorecard=scorecard,
        autopilot=pilot,
        metrics=Metrics(engine_loop, settings.model_name) if settings.metrics else None,
        store=store,
        recorder=recorder,
        fit_from=fit_from,
    )
    app.state.server = state
    install_error_handlers(app)
    routers = (
        openai_routes,
        control,
        experts,
        telemetry_ws,
        metrics,
        sessions,
        replay_ws,
        whatif,
        attribution,
        autopilot,
    )
    for module in routers:
        app.include_router(module.router)
    app.add_middleware(
        GuardMiddleware,
        api_key=settings.api_key,
        admin_key=settings.admin_key,
        max_body_bytes=settings.max_body_bytes,
    )
    # The dashboard's charts read the API from the browser, at the dashboard's origin: any
    # origin may GET with the bearer key, as a script could; changes go through the
    # dashboard's Python, never straight from a browser. Outside the guard: a preflight
    # carries no key.
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_methods=["GET"], allow_headers=["Authorization"]
    )
    return app
