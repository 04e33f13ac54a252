"""The what-if scorecard: every applied knob change, whatever its origin, predicted by the live
twin when it applies, then observed once its horizon has passed, with each metric's error."""

import asyncio
import logging
import time
from collections import deque
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

KEEP = 256  # entries kept in memory
SIDE = ("knobs", *METRICS, "unfinished")  # what an entry keeps of each predicted side


class Scorecard:
    """Entries newest first (`entries`, in memory; also in `store` when there is one)."""

    def __init__(self, twins: Twins, window: LiveWindow, session: str, horizon_s: float) -> None:
        self.twins = twins
        self.window = window
        self.store: Store | None = twins.store
        self.session = session
        self.horizon_s = horizon_s
        self.entries: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.tasks: set[asyncio.Task[None]] = set()

    def watch(self, change: dict[str, Any], applied_t: float) -> None:
        """Score an applied KnobChange dict (call on the event loop)."""
        task = asyncio.create_task(self._score(change, applied_t))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _score(self, change: dict[str, Any], applied_t: float) -> None:
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
        new = {k: new for k, (_, new) in change["changes"].items() if k in Knobs.model_fields}
        try:
            result = await self.twins.live(new, self.horizon_s, version=change["version"] - 1)
            entry["predicted"] = _slim(result)
        except (InvalidInput, EngineDead) as exc:
            entry["reason"] = f"no prediction: {exc}"
        except Exception as exc:  # a failed prediction is recorded and logged, never fatal
            log.exception("what-if scorecard: no prediction for version %s", entry["version"])
            entry["reason"] = f"no prediction: {type(exc).__name__}: {exc}"
        row = await self._write(db.add_prediction, entry)
        # asyncio's clock is monotonic and coarse: sleep again until the wall clock is there
        while (left := applied_t + self.horizon_s - time.time()) > 0:
            await asyncio.sleep(left)
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
        "requests": result["requests"],
        "t": result["t"],
        "wall_s": result["wall_s"],
        "approximations": result["approximations"],
    }
