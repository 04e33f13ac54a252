"""Bands: a what-if answered by several simulations that vary what the twin does not know.

One simulation gives one number per metric, and near capacity a 30-40% error in step cost
decides whether a queue builds: a single number read as a promise was off by 3-7x there
(issue 49). So a what-if runs DRAWS simulations of the same trace and knobs. The first is
the nominal one (the fit's step costs, the recorded expert loads in recorded order, the
arrivals as recorded); each other one draws

- step costs: the whole run `Residuals.runs` slower or faster (one run or stretch the fit
  saw, drawn at random: the run-to-run variation), and each step's cost times a held-out
  error of its own step shape (`Residuals.pool`);
- expert loads: the recorded steps of each size replayed from a random start;
- arrivals: each new arrival shifted by up to JITTER_S either way (HTTP clients and event
  loops do not deliver at the recorded instant), the order kept by sorting.

Each metric is answered by the median of the draws and an 80% band (their 10th to 90th
percentiles); the share of draws in which the queue builds (`builds`) says how close the
setting runs to capacity.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import stats
from tuning.twin.cost_model import NO_RESIDUALS, CostModel, Residuals, shape_keys
from tuning.twin.experts import ExpertDraw
from tuning.twin.simulator import SimResult, StepCost
from tuning.twin.trace import TraceItem

DRAWS = 10  # simulations per what-if (the nominal one and DRAWS - 1 drawn)
BAND = (10.0, 90.0)  # percentiles of the draws: an 80% band
JITTER_S = 0.02  # an arrival lands up to this much earlier or later
STRETCHES = 3  # the first of these stretches of the arrivals' span met an empty engine
RISE = 3.0  # the queue builds: the wait's trend rises this many times the first's median
RISE_STEPS = 10  # ... and longer by at least this many steps
SATURATED = 0.5  # flagged "the queue builds": in at least this share of the draws
UNIFORM_BLOCK = 4096  # uniforms drawn at a time, as the steps reach them


class NoisyCost:
    """A model's step costs times one run factor and, per step, a held-out error of the
    step's shape, drawn by `rng` from `residuals` (a StepCost for the simulator). A step's
    error is drawn with the step's number (the simulation's n-th step draws the n-th
    uniform), so that costing steps one by one or several together gives the same."""

    def __init__(self, model: StepCost, residuals: Residuals, rng: np.random.Generator) -> None:
        self.model = model
        self.residuals = residuals
        self.rng = rng
        self.factor = float(rng.choice(residuals.runs))
        self.uniform = rng.random(UNIFORM_BLOCK)

    def step_ms(self, x: np.ndarray, step: int) -> float:
        return self.model.step_ms(x, step) * self.factor * self._ratio(x, step)

    def period_ms(self, x: np.ndarray, step: int) -> float:
        return self.model.period_ms(x, step) * self.factor * self._ratio(x, step)

    def periods_ms(self, xs: np.ndarray, first: int) -> np.ndarray:
        return self.model.periods_ms(xs, first) * self.factor * self._ratios(xs, first)

    def outside(self, x: np.ndarray) -> list[str]:
        return self.model.outside(x)

    def _ratio(self, x: np.ndarray, step: int) -> float:
        """The held-out error drawn for step `step` of FEATURES `x` (as `_ratios` draws it)."""
        self._draw_to(step + 1)
        pool = self.residuals.pool(x)
        return float(pool[int(self.uniform[step] * len(pool))])

    def _ratios(self, xs: np.ndarray, first: int) -> np.ndarray:
        """The held-out errors drawn for steps `first`, `first` + 1, ... of rows `xs`."""
        self._draw_to(first + len(xs))
        picks = self.uniform[first : first + len(xs)]
        keys, rows = shape_keys(xs)
        out = np.empty(len(xs))
        for key, at in zip(keys, rows, strict=True):
            pool = self.residuals.by_shape.get(key, self.residuals.overall)
            out[at] = pool[(picks[at] * len(pool)).astype(np.int64)]
        return out

    def _draw_to(self, steps: int) -> None:
        """Uniforms for the first `steps` steps at least."""
        while steps > len(self.uniform):
            self.uniform = np.concatenate([self.uniform, self.rng.random(UNIFORM_BLOCK)])


def jittered(trace: list[TraceItem], rng: random.Random) -> list[TraceItem]:
    """`trace` with each arrival still to come (offset > 0) moved by up to JITTER_S, kept at
    or after 0 and in time order; the requests already queued (offset <= 0) stay."""
    moved = [
        replace(t, offset_s=max(0.0, t.offset_s + rng.uniform(-JITTER_S, JITTER_S)))
        if t.offset_s > 0
        else t
        for t in trace
    ]
    return sorted(moved, key=lambda t: t.offset_s)


@dataclass(frozen=True)
class Draw:
    """What one simulation of a what-if varies: its cost model, trace, and expert loads' start."""

    model: StepCost
    trace: list[TraceItem]
    seed: int | None  # None: the recorded loads from the first (the nominal draw)


def draws(model: StepCost, trace: list[TraceItem], n: int, seed: int = 0) -> list[Draw]:
    """The nominal draw and `n` - 1 drawn ones, seeded: every knob set weighed at one look
    meets the same draws, so they differ by their knobs. A model that is no fitted CostModel
    (a test's known costs) has no residuals: its draws vary loads and arrivals only."""
    residuals = model.residuals if isinstance(model, CostModel) else NO_RESIDUALS
    out = [Draw(model, trace, None)]
    for i in range(1, n):
        rng = np.random.default_rng((seed, i))
        noisy = NoisyCost(model, residuals, rng)
        out.append(Draw(noisy, jittered(trace, random.Random(seed * 7919 + i)), i))
    return out


def restart(experts: ExpertDraw, seed: int | None) -> None:
    """Replay the recorded loads from the first (None) or from a start drawn by `seed`."""
    experts.restart()
    if seed is not None:
        rng = random.Random(seed)
        experts.used = {size: rng.randrange(len(experts.by_size[size])) for size in experts.sizes}


def builds(result: SimResult, trace: list[TraceItem]) -> bool:
    """Whether the queue built over the horizon: the wait for a first token (or so far, when
    cut off) grew with the arrival time, its least-squares slope over the arrivals' span
    rising at least RISE times the median wait of the first of STRETCHES stretches (which met
    an empty engine) and by at least RISE_STEPS steps (the median TPOT). A wait that grows
    with the arrivals, not one long from the start, nor bursts that queue and drain (they
    made a later stretch's median wait RISE times the first's in 9 of 10 simulations of an
    unsaturated bursty load: benchmarks/control/twin_accuracy.py); least squares, not a
    robust fit, so that the long waits of requests preempted under a KV cap count."""
    span = max((t.offset_s for t in trace), default=0.0)
    if result.end_s < span:
        span = result.end_s  # a horizon cut the arrivals short
    if span <= 0:
        return False
    arrivals, waits, tpots = [], [], []
    for r in result.records:
        if r.ttft_ms is not None and r.arrival <= span:
            arrivals.append(r.arrival)
            waits.append(r.ttft_ms)
        if r.output_len > 1 and r.ttft_ms is not None:
            tpots.append(stats.tpot_span(r.ttft_ms, r.e2e_ms, r.output_len))
    for c in result.cut:
        arrival = result.end_s - c.waited_ms / 1000
        if arrival <= span:
            arrivals.append(arrival)
            waits.append(c.waited_ms if c.ttft_ms is None else c.ttft_ms)
    # a live twin's requests that arrived before its snapshot count as arriving at it
    at, wait = np.maximum(np.array(arrivals), 0.0), np.array(waits)
    first = wait[at < span / STRETCHES]
    if len(first) == 0 or len(np.unique(at)) < 2:
        return False
    rise = float(np.polyfit(at, wait, 1)[0]) * span
    known = [t for t in tpots if t is not None]
    step = float(np.median(known)) if known else 0.0
    return rise >= RISE * float(np.median(first)) and rise >= RISE_STEPS * step


def band(values: Sequence[float | None]) -> tuple[float | None, list[float | None]]:
    """The median and [10th, 90th] percentiles of the draws' values (None where none has one)."""
    known = [v for v in values if v is not None]
    if not known:
        return None, [None, None]
    low, high = (stats.percentile(known, q) for q in BAND)
    return stats.percentile(known, 50), [low, high]


def saturation(built: Sequence[bool]) -> dict[str, Any]:
    """How close to capacity a setting runs: in how many draws the queue built, in words."""
    k, n = sum(built), len(built)
    if k == 0:
        text = f"the queue stays bounded in all {n} simulations"
    elif k == n:
        text = f"saturated: the queue builds in all {n} simulations"
    else:
        text = f"within the noise of saturation: the queue builds in {k} of {n} simulations"
    return {"builds": k, "draws": n, "share": k / n if n else 0.0, "text": text}


def banded(
    outcomes: list[dict[str, Any]], built: list[bool], names: Sequence[str]
) -> dict[str, Any]:
    """One side of a what-if from its draws' outcomes (the first the nominal one): each of
    `names` as the median with its band in `bands`, the saturation, and the nominal draw's
    per-request latencies (`latencies_ms`, `cut_ms`, `span_s`)."""
    out: dict[str, Any] = {"bands": {}}
    for name in names:
        out[name], out["bands"][name] = band([o.get(name) for o in outcomes])
    nominal = outcomes[0]
    out.update({k: nominal[k] for k in ("latencies_ms", "cut_ms", "span_s") if k in nominal})
    out["saturation"] = saturation(built)
    return out
