"""The live engine's recent past on the API side: its last steps, per-step counts and ended
requests, drained from the loop's buses by an asyncio task (never on the engine thread)."""

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from api.bus_reader import BusReader
from engine.knobs import Knobs
from engine.loop import EngineLoop
from tuning.outcome import METRICS, StepCounts, outcome, step_counts, totals

# whole step records kept to fit the live twin's cost model: plenty for its ten weights, and
# each is tens of KB in memory with many experts and slots
FIT_STEPS = 512
MAX_COUNTS = 1 << 17  # per-step counts kept for observations (a bound on memory)
MAX_RECORDS = 1 << 16  # ended requests kept

KnobChangeHook = Callable[[dict[str, Any], float], None]


class LiveWindow(BusReader):
    """Bounded: the last FIT_STEPS StepTelemetry records, and the StepCounts and RequestRecords
    of the last `keep_s` seconds. `on_change(change, t)` hears each applied knob change (a
    KnobChange dict touching a knob) with the time of the step that reported it."""

    def __init__(self, engine_loop: EngineLoop, keep_s: float) -> None:
        super().__init__(engine_loop)
        self.keep_s = keep_s
        self.steps: deque[dict[str, Any]] = deque(maxlen=FIT_STEPS)
        self.counts: deque[StepCounts] = deque(maxlen=MAX_COUNTS)
        self.records: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDS)
        self.started_t = time.time()
        self.on_change: KnobChangeHook | None = None

    def subscribe(self) -> None:
        """Start listening (before the engine starts, so that no step is missed)."""
        super().subscribe()
        self.started_t = time.time()

    def drain(self) -> None:
        """Take in what the buses hold; call on the event loop (hooks may start tasks)."""
        steps, ended, _ = self.take()
        for step in steps:
            self.steps.append(step)
            self.counts.append(step_counts(step))
            for change in step.get("knob_changes") or ():
                if self.on_change is not None and set(change["changes"]) & set(Knobs.model_fields):
                    self.on_change(change, step["t"])
        self.records.extend(ended)
        oldest = time.time() - self.keep_s
        while self.counts and self.counts[0].t < oldest:
            self.counts.popleft()
        while self.records and self.records[0]["finished_t"] < oldest:
            self.records.popleft()

    def observe(self, t0: float, t1: float) -> dict[str, Any]:
        """METRICS of the requests that ended and the steps that ran between t0 and t1 (the
        `tuning.outcome` definitions), with how many of each."""
        records = [r for r in self.records if t0 <= r["finished_t"] <= t1]
        counts = [c for c in self.counts if t0 <= c.t <= t1]
        result = outcome(records, totals(counts))
        return {**{m: result[m] for m in METRICS}, "requests": len(records), "steps": len(counts)}
