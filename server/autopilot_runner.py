"""The SLO autopilot on the server: every interval it reads the live window, attributes the
recent requests on a low-priority worker thread (never the engine thread, never the event
loop), asks the live twin about a few knob sets in the analysis process (server/analysis.py:
a simulation in this process would hold the GIL the engine thread needs at every torch
operation) and applies its choice through `update_knobs(origin="autopilot", reason=...)`."""

import asyncio
import contextlib
import functools
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from engine.errors import InvalidInput
from engine.loop import EngineDead, EngineLoop
from engine.queue_snapshot import QueueSnapshot
from server.analysis import Analysis
from server.engine_info import engine_description
from server.live_attribution import live_report
from server.live_window import AttributionView, LiveWindow
from stats import SLO
from tuning.autopilot.pilot import Autopilot, Decision, Evaluate
from tuning.autopilot.settings import AutopilotSettings
from tuning.twin.cost_model import stack
from tuning.twin.experts import stacked
from tuning.twin.live import arrival_window, stretched_horizon, twin_from_live
from tuning.twin.tune import Trial, evaluate
from tuning.twin.whatif import Twin

# the origin of the SLO autopilot's own changes (server.autopilot_runner): a person's change
# sent under it would neither pause the autopilot nor be drawn as a person's
AUTOPILOT_ORIGIN = "autopilot"
# simulations per candidate at a look: its bands and saturation share, at half a what-if's
# draws (a look weighs up to a dozen candidates, every few seconds)
AUTOPILOT_DRAWS = 5


class AutopilotRunner:
    """One server's autopilot. The event loop and the worker share `pilot` under `_lock`,
    which a tick lets go of while the twin runs, so that a PUT or a person's knob change is
    taken at once; a tick whose settings or pause changed meanwhile is dropped."""

    def __init__(
        self,
        engine_loop: EngineLoop,
        window: LiveWindow,
        settings: AutopilotSettings,
        analysis: Analysis,
    ) -> None:
        self.engine_loop = engine_loop
        self.window = window
        self.pilot = Autopilot(settings)
        self._lock = threading.Lock()
        # at normal priority: measuring and deciding are cheap, and a controller meant to act
        # under overload must not be starved by it (niced, it made no tick while two other
        # processes held both cores); the twin's simulations run niced in `analysis`
        self._executor = ThreadPoolExecutor(1, "autopilot")
        self._analysis = analysis
        self.cpu_s = 0.0  # the worker's and the analysis process's CPU time over every tick
        self.ticks = 0

    @property
    def settings(self) -> AutopilotSettings:
        return self.pilot.settings

    def configure(self, settings: AutopilotSettings) -> None:
        with self._lock:
            self.pilot.configure(settings)

    def knob_changed(self, change: dict[str, Any], t: float) -> None:
        """A LiveWindow hook: a change someone else made pauses the autopilot."""
        if change["origin"] != AUTOPILOT_ORIGIN:
            with self._lock:
                self.pilot.person_changed(t, change["origin"])

    def status(self, history: int = 0) -> dict[str, Any]:
        with self._lock:
            out = self.pilot.status(history)
        return {
            "settings": self.settings.model_dump(),
            **out,
            "ticks": self.ticks,
            "cpu_s": round(self.cpu_s, 4),
        }

    async def run(self) -> None:
        """Tick every `settings.interval_s` until cancelled."""
        try:
            while True:
                await asyncio.sleep(self.settings.interval_s)
                if self.settings.enabled:
                    await self.tick()
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def tick(self) -> Decision | None:
        """One tick: the decision applied (or refused), or None when it held. Its reads on
        the event loop and the engine thread count in `cpu_s` too."""
        cpu0 = time.thread_time()
        self.window.drain()
        view = self.window.attribution_view()
        routed = (list(self.window.routed), self.window.top_k)
        rows = self.window.fit_rows.rows()
        self.cpu_s += time.thread_time() - cpu0
        try:
            # the twin runs under the knobs in force: no earlier change need come with them
            since = self.engine_loop.engine.applied_knobs_version
            snapshot = await asyncio.wrap_future(self.engine_loop.snapshot(since))
        except EngineDead:
            return None
        cpu0 = time.thread_time()
        config = engine_description(self.engine_loop)
        started = self.window.started_t
        self.cpu_s += snapshot.cpu_s + time.thread_time() - cpu0
        decision = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._decide, view, routed, rows, snapshot, config, started
        )
        if decision is not None:
            await self._apply(decision)
        return decision

    def _decide(
        self,
        view: AttributionView,
        routed: tuple[list[np.ndarray], int],
        rows: list[np.ndarray],
        snapshot: QueueSnapshot,
        config: dict[str, Any],
        started_t: float,
    ) -> Decision | None:
        """On the worker: attribute, then tick the pilot with the twin as its evaluator."""
        cpu0 = time.thread_time()
        try:
            s = self.settings
            young = arrival_window(snapshot.t - started_t)

            @functools.cache  # once a check, and only on a tick that asks the twin
            def check_inputs(window: float, least: int) -> bytes:
                # pickled here, so that this thread's CPU time counts it: the pool's feeder
                # thread would do it unseen, on the server's GIL all the same
                inputs = (stacked(*routed), stack(rows), view.records, snapshot, window, least)
                return pickle.dumps((config, s, *inputs))

            def twin_trials(
                changes: list[dict[str, Any]],
                window_s: float,
                errors: float = 0.0,
                min_requests: int = 0,
            ) -> list[Trial]:
                inputs = check_inputs(min(window_s, young), min_requests)
                future = self._analysis.submit(live_trials, inputs, changes, errors)
                trials, cpu_s = future.result()
                self.cpu_s += cpu_s
                return trials

            with self._lock:
                return self.pilot.tick(
                    snapshot.t,
                    snapshot.knobs,
                    view.records,
                    lambda: _attribution(view, s.observe_s),
                    self._unlocked(twin_trials),
                    snapshot.arrivals(started=False),
                    [(r["arrival"], r["prompt_len"]) for r in view.records]
                    + [(q.arrival, q.prompt_len) for q in snapshot.requests],
                    snapshot.arrivals(started=True),
                )
        finally:
            self.cpu_s += time.thread_time() - cpu0
            self.ticks += 1

    def _unlocked(self, run: Evaluate) -> Evaluate:
        """`run` with the lock let go while it runs (called with the lock held)."""

        def call(
            changes: list[dict[str, Any]],
            window_s: float,
            errors: float = 0.0,
            min_requests: int = 0,
        ) -> list[Trial]:
            with self._released():
                return run(changes, window_s, errors, min_requests)

        return call

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    async def _apply(self, decision: Decision) -> None:
        latest = self.engine_loop.knobs.model_dump()
        if any(latest[k] != old for k, (old, _) in decision.changes.items()):
            with self._lock:  # someone changed them since the twin checked: theirs stands
                self.pilot.dropped()
            return
        future = self.engine_loop.update_knobs(
            decision.knob_values(), AUTOPILOT_ORIGIN, decision.reason
        )
        try:
            version = await asyncio.wrap_future(future)
        except (InvalidInput, EngineDead) as exc:
            with self._lock:
                self.pilot.refused(decision, str(exc))
            return
        with self._lock:
            self.pilot.applied(decision, version)


def live_trials(
    inputs: bytes, changes: list[dict[str, Any]], errors: float
) -> tuple[list[Trial], float]:
    """In the analysis process: the live twin's trial of each of `changes`, its steps `errors`
    held-out errors longer than its fit, and the CPU seconds they took, unpickling included.
    `inputs` holds the pickled inputs of the autopilot's check (`_check_twin`)."""
    cpu0 = time.process_time()
    twin, horizon_s, slo = _check_twin(inputs)
    tried = replace(twin, model=twin.model.off_by(errors), num_draws=AUTOPILOT_DRAWS)
    trials = [evaluate(tried, c, slo, horizon_s) for c in changes]
    return trials, time.process_time() - cpu0


@functools.lru_cache(maxsize=1)
def _check_twin(inputs: bytes) -> tuple[Twin, float, SLO]:
    """The twin of one check (`inputs`: the pickled engine description, settings, routing,
    cost model rows, ended records, queue snapshot, arrivals window and least requests), its
    horizon and the targets. Kept for the check's later runs (its candidates, then the runs
    under the twin's error): they fit no model again, and find the expert loads drawn for step
    sizes seen (the draws are seeded by size, so a twin kept gives what a new one would)."""
    config, settings, routing, rows, records, snapshot, window_s, least = pickle.loads(inputs)
    horizon_s = stretched_horizon(
        snapshot.requests, records, snapshot.t, window_s, settings.horizon_s, least
    )
    twin, _ = twin_from_live(config, routing, rows, records, snapshot, window_s, horizon_s)
    return twin, horizon_s, settings.slo


def _attribution(view: AttributionView, window_s: float) -> dict[str, Any] | None:
    """The causes of the requests that ended in the last `window_s` (None if unattributable)."""
    try:
        return live_report(view, window_s, window_s, 0)
    except InvalidInput:
        return None
