"""The what-if scorecard: every applied knob change, whatever its origin, predicted by the live
twin when it applies, then observed once its horizon has passed, with each metric's error."""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from engine.errors import InvalidInput
from engine.knobs import Knobs
from engine.loop import EngineDead
from server.live_window import LiveWindow
from server.twins import Twins
from storage import Store
from storage import scorecard as db
from tuning.twin.outcome import METRICS, metric_errors

log = logging.getLogger(__name__)

KEEP = 256  # entries kept in memory, and changes waiting for the twin or for their horizon
# what an entry keeps of each predicted side: medians, 80% bands and the saturation
SIDE = ("knobs", *METRICS, "unfinished", "bands", "saturation")
# simulations a prediction runs (the nominal one and two drawn): every applied change is
# predicted, and only within its horizon (STALE); five a side took longer than a 3 s horizon
# on a machine with 2 cores and a load average of 12
DRAWS = 3
# a prediction is made within its change's horizon, or not at all: the twin predicts from the
# queue as it stands, which a change whose horizon has passed no longer shaped
STALE = "no prediction: the twin was busy until the change's horizon had passed"


class Scorecard:
    """Entries newest first (`entries`, in memory; also in `store` when there is one).

    One task predicts, one observes: a change waits for the twin in `unpredicted` (holding
    nothing but its entry: the twin copies the live window only once it is free), then for its
    horizon in `due`. Changes can come faster than the twin runs: every queue keeps at most
    KEEP entries (`dropped` counts those that fell out before they were scored), and a change
    still waiting when its horizon has passed is observed without a prediction.
    """

    def __init__(self, twins: Twins, window: LiveWindow, session: str, horizon_s: float) -> None:
        self.twins = twins
        self.window = window
        self.store: Store | None = twins.store
        self.session = session
        self.horizon_s = horizon_s
        self.entries: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.unpredicted: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.due: deque[tuple[dict[str, Any], Any]] = deque(maxlen=KEEP)  # (entry, its row)
        self.dropped = 0  # changes that fell out of a queue before they were scored
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def watch(self, change: dict[str, Any], applied_t: float) -> None:
        """Score an applied KnobChange dict (call on the event loop)."""
        entry = {
            "session": self.session,
            "version": change["version"],
            "t": applied_t,
            "origin": change["origin"],
            "changes": change["changes"],
            "horizon_s": self.horizon_s,
            "predicted": None,
            "reason": None,
            "observed": None,
            "errors": None,
            "observed_t": None,
        }
        self.entries.appendleft(entry)
        self._append(self.unpredicted, entry)
        self._run("predict", self._predict_all)

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def _append(self, queue: deque[Any], item: Any) -> None:
        if len(queue) == queue.maxlen:
            self.dropped += 1  # append lets the oldest go
        queue.append(item)

    def _run(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start task `name` unless it runs: it works its queue until that is empty (and is
        done in the same event-loop step that finds it empty, so nothing waits unseen)."""
        task = self.tasks.get(name)
        if task is None or task.done():
            self.tasks[name] = asyncio.create_task(work())

    async def _predict_all(self) -> None:
        while self.unpredicted:
            entry = self.unpredicted.popleft()
            if time.time() < entry["t"] + self.horizon_s:
                await self._predict(entry)
            else:
                entry["reason"] = STALE
            row = await self._write(db.add_prediction, entry)
            self._append(self.due, (entry, row))
            self._run("observe", self._observe_all)

    async def _predict(self, entry: dict[str, Any]) -> None:
        new = {k: new for k, (_, new) in entry["changes"].items() if k in Knobs.model_fields}
        try:
            result = await self.twins.live(
                new, self.horizon_s, version=entry["version"] - 1, draws=DRAWS
            )
            entry["predicted"] = _slim(result)
        except (InvalidInput, EngineDead) as exc:
            entry["reason"] = f"no prediction: {exc}"
        except Exception as exc:  # a failed prediction is recorded and logged, never fatal
            log.exception("what-if scorecard: no prediction for version %s", entry["version"])
            entry["reason"] = f"no prediction: {type(exc).__name__}: {exc}"

    async def _observe_all(self) -> None:
        while self.due:
            entry, row = self.due[0]
            # asyncio's clock is monotonic and coarse: sleep again until the wall clock is there
            while (left := entry["t"] + self.horizon_s - time.time()) > 0:
                await asyncio.sleep(left)
            self.due.popleft()
            await self._observe(entry, row)

    async def _observe(self, entry: dict[str, Any], row: Any) -> None:
        applied_t = entry["t"]
        self.window.drain()
        observed = self.window.observe(applied_t, applied_t + self.horizon_s)
        during = [e for e in self.entries if applied_t < e["t"] <= applied_t + self.horizon_s]
        entry["observed"] = {**observed, "changes_during": len(during)}
        if entry["predicted"] is not None:
            entry["errors"] = metric_errors(entry["predicted"]["candidate"], observed)
        entry["observed_t"] = time.time()
        if row is not None:
            await self._write(db.add_observation, row, entry)

    async def _write(self, func: Any, *args: Any) -> Any:
        """A storage call off the event loop; a database error is logged (memory keeps it)."""
        if self.store is None:
            return None
        try:
            return await asyncio.to_thread(func, self.store, *args)
        except SQLAlchemyError as exc:
            log.warning("what-if scorecard: could not write to %s: %s", self.store.display_url, exc)
            return None


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """A what-if result without its per-request latencies."""
    sides = {side: {k: result[side][k] for k in SIDE} for side in ("current", "candidate")}
    return {
        **sides,
        "fit": result["fit"],
        "draws": result["draws"],
        "requests": result["requests"],
        "t": result["t"],
        "wall_s": result["wall_s"],
        "approximations": result["approximations"],
    }
