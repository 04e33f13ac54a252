"""The live engine's recent past on the API side: its last steps, per-step counts and ended
requests, drained from the loop's buses by an asyncio task (never on the engine thread)."""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.knobs import Knobs
from engine.loop import EngineLoop
from server.bus_reader import BusReader
from tuning.twin.experts import Routing, routed, stacked
from tuning.twin.fit_rows import FitRows
from tuning.twin.outcome import METRICS, StepCounts, outcome, step_counts, totals

# the steps whose expert loads the live twin draws from (its cost model fits rows kept
# longer: `fit_rows`)
FIT_STEPS = 512
MAX_COUNTS = 1 << 17  # per-step counts kept for observations (a bound on memory)
MAX_RECORDS = 1 << 16  # ended requests kept
# compact steps kept for latency attribution, which needs every step of a request's life: at
# 5 ms a step, 80 s, past the requests kept (`keep_s`, 70 s by default) back to their arrival.
# A step keeps its batch slots, about 200 B each: some 100 MB at 32 slots a step at most
ATTRIBUTION_STEPS = 16384

KnobChangeHook = Callable[[dict[str, Any], float], None]


@dataclass(frozen=True)
class AttributionView:
    """A copy of what latency attribution reads from the window, taken on the event loop at
    `t`: the compact steps and the requests that ended from `since` on. Every step that ended
    after `kept_after` is there; a request that arrived before it fell out of the window."""

    steps: list[dict[str, Any]]
    records: list[dict[str, Any]]
    kept_after: float
    since: float
    t: float


def compact(step: dict[str, Any]) -> dict[str, Any]:
    """The fields of a StepTelemetry record that tuning.attribution.causes reads."""
    dur, batch, a2a = step["dur_ms"], step["batch"], step["a2a"]
    return {
        "v": step["v"],
        "step": step["step"],
        "t": step["t"],
        "dur_ms": {"total": dur["total"], "moe": dur["moe"]},
        "batch": {k: batch[k] for k in ("num_prefill_tokens", "num_decode_tokens", "slots")},
        "a2a": {"ep_size": a2a["ep_size"], "imbalance": a2a["imbalance"]},
        "sched": step["sched"],
    }


class LiveWindow(BusReader):
    """Bounded: the expert loads of the last FIT_STEPS steps, the live twin's cost-model rows of
    every step (`FitRows`), the last ATTRIBUTION_STEPS steps compacted, and the StepCounts and
    RequestRecords of the last `keep_s` seconds.
    Each of `change_hooks`, `hook(change, t)`, hears each applied knob change (a KnobChange
    dict touching a knob) with the time of the step that reported it."""

    def __init__(self, engine_loop: EngineLoop, keep_s: float) -> None:
        super().__init__(engine_loop)
        self.keep_s = keep_s
        self.routed: deque[np.ndarray] = deque(maxlen=FIT_STEPS)
        self.top_k = engine_loop.engine.model_config.top_k
        self.fit_rows = FitRows(engine_loop.knobs.model_dump())
        self.counts: deque[StepCounts] = deque(maxlen=MAX_COUNTS)
        self.records: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDS)
        self.attributable: deque[dict[str, Any]] = deque(maxlen=ATTRIBUTION_STEPS)
        self.kept_after = 0.0  # every step that ended after this is in `attributable`
        self.started_t = time.time()
        self.change_hooks: list[KnobChangeHook] = []

    def subscribe(self) -> None:
        """Start listening (before the engine starts, so that no step is missed)."""
        super().subscribe()
        self.started_t = time.time()

    def drain(self) -> None:
        """Take in what the buses hold; call on the event loop (hooks may start tasks)."""
        steps, ended, dropped = self.take()
        if dropped and steps:  # the buses lost records, perhaps steps before these
            self.kept_after = max(self.kept_after, steps[0]["t"])
        for step in steps:
            if (counts := routed(step)) is not None:
                self.routed.append(counts)
            self.fit_rows.add(step)
            self._keep_compact(step)
            self.counts.append(step_counts(step))
            for change in step.get("knob_changes") or ():
                if set(change["changes"]) & set(Knobs.model_fields):
                    for hook in self.change_hooks:
                        hook(change, step["t"])
        self.records.extend(ended)
        oldest = time.time() - self.keep_s
        while self.counts and self.counts[0].t < oldest:
            self.counts.popleft()
        while self.records and self.records[0]["finished_t"] < oldest:
            self.records.popleft()

    def routing(self) -> Routing:
        """The expert loads of the last FIT_STEPS steps that routed any, for the live twin."""
        return stacked(self.routed, self.top_k)

    def _keep_compact(self, step: dict[str, Any]) -> None:
        if len(self.attributable) == self.attributable.maxlen:
            self.kept_after = self.attributable[0]["t"]
        self.attributable.append(compact(step))

    def attribution_view(self) -> AttributionView:
        """A copy for attribution off the event loop (take it on the loop, after `drain`)."""
        now = time.time()
        return AttributionView(
            list(self.attributable),
            list(self.records),
            self.kept_after,
            max(self.started_t, now - self.keep_s),
            now,
        )

    def observe(self, t0: float, t1: float) -> dict[str, Any]:
        """METRICS of the requests that ended and the steps that ran between t0 and t1 (the
        `tuning.twin.outcome` definitions), with how many of each."""
        records = [r for r in self.records if t0 <= r["finished_t"] <= t1]
        counts = [c for c in self.counts if t0 <= c.t <= t1]
        result = outcome(records, totals(counts))
        return {**{m: result[m] for m in METRICS}, "requests": len(records), "steps": len(counts)}
