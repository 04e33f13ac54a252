"""The step-cost model: a step's duration from its composition, fitted from telemetry.

Three non-negative linear models: the MoE layers' time (`dur_ms.moe`) over the expert
features, the rest of the engine's step (`dur_ms.total` less MoE) over the batch features,
and the loop's overhead around the step (delivering outputs, publishing records) over the
batch features, measured as the time from the previous step's end to this one's end, less
the step's own time, for steps that followed a busy step (so no idle wait is counted).
Timing MoE apart keeps expert load and batch size from standing in for each other (they
move together until a capacity factor drops pairs). Step time plus overhead is how far a
step moves the clock. Non-negative weights keep the model monotone, so it extrapolates
sanely to larger batches than it saw, and `outside` says when a step lies far beyond them.
What the fit gets wrong on held-out steps is kept (`Residuals`): the bands of a what-if draw
step costs from it (tuning.twin.bands).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
from scipy.optimize import nnls

from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.twin.features import BATCH, FEATURES, MOE, recorded_features

MIN_STEPS = 40  # busy steps needed to fit
HOLDOUT_EVERY = 5  # every 5th step is held out to measure the fit error
REACH = 2.0  # how far past the largest value seen a step may lie and still be predicted
SHAPE = ("prefill_tokens", "prefill_attn_k", "decode_seqs", "decode_ctx_k", "expert_pairs_k")
SHAPE_AT = tuple(FEATURES.index(name) for name in SHAPE)
_SHAPE_INDEX = np.array(SHAPE_AT)  # to index arrays with; a tuple iterates faster (fit_rows)
SPEED_PASSES = 4  # fits alternating with the stretches' speeds (`_speeds`)
SEGMENTS = 4  # each run's steps, cut in this many stretches of time: its speed varies
MIN_POOL = 8  # held-out steps of a shape needed to draw its costs from them alone


def shape_key(x: np.ndarray) -> tuple[int, ...]:
    """The binary order of magnitude of each SHAPE feature of a row of FEATURES."""
    return tuple(int(math.log2(1.0 + x[i])) for i in SHAPE_AT)


def shape_keys(xs: np.ndarray) -> tuple[list[tuple[int, ...]], list[np.ndarray]]:
    """The distinct `shape_key`s of the rows of `xs`, and the rows that have each."""
    mags = np.log2(1.0 + xs[:, _SHAPE_INDEX]).astype(np.int64)
    if (mags == mags[0]).all():  # the common case: a stretch of decode steps
        return [tuple(mags[0].tolist())], [np.arange(len(xs))]
    found, which = np.unique(mags, axis=0, return_inverse=True)
    which = which.reshape(-1)
    return [tuple(row) for row in found.tolist()], [
        np.flatnonzero(which == i) for i in range(len(found))
    ]


@dataclass(frozen=True)
class Residuals:
    """What the fit got wrong on held-out steps, as measured period over predicted period.

    `runs`: per stretch of time of each run fitted (`stretches`), the ratio of its held-out
    steps' measured time to their predicted time: how much slower or faster a run went (other
    work on the machine, another client), between runs and within one. `by_shape`: per step
    shape (`shape_key`) with at least MIN_POOL held-out steps, each step's ratio over its
    run's: the step-to-step error, which differs by shape (a long prefill's is not a decode's);
    `overall` pools every shape's."""

    runs: np.ndarray
    by_shape: dict[tuple[int, ...], np.ndarray]
    overall: np.ndarray

    def pool(self, x: np.ndarray) -> np.ndarray:
        """The step ratios to draw a step of FEATURES `x`'s cost from."""
        return self.by_shape.get(shape_key(x), self.overall)

    def describe(self) -> dict[str, Any]:
        q = np.percentile(self.overall, [10, 90]).round(3).tolist() if self.overall.size else []
        return {
            "runs": self.runs.round(3).tolist(),
            "shapes": len(self.by_shape),
            "step_ratio_p10_p90": q,
        }


NO_RESIDUALS = Residuals(np.ones(1), {}, np.ones(1))


@dataclass(frozen=True)
class CostModel:
    step_w: np.ndarray  # ms per unit of each feature: the engine's step time (dense + MoE)
    overhead_w: np.ndarray  # ms per unit: the loop's time between steps
    seen_max: np.ndarray  # the largest value of each feature in the fit
    mape: float  # of the step period on held-out steps
    num_steps: int
    residuals: Residuals = NO_RESIDUALS

    def step_ms(self, x: np.ndarray, step: int = 0) -> float:
        return float(self.step_w @ x)

    def period_ms(self, x: np.ndarray, step: int = 0) -> float:
        """How far a step moves the clock: its own time plus the loop's around it."""
        return float(self._period_w @ x)

    def periods_ms(self, xs: np.ndarray, first: int = 0) -> np.ndarray:
        """`period_ms` of each row of `xs`."""
        return xs @ self._period_w

    @cached_property
    def _period_w(self) -> np.ndarray:
        return self.step_w + self.overhead_w

    def off_by(self, errors: float) -> "CostModel":
        """This model with every step `errors` held-out errors longer (shorter if negative):
        what a decision should survive, since the fit is only that good."""
        factor = max(0.0, 1.0 + errors * self.mape)
        return replace(self, step_w=self.step_w * factor, overhead_w=self.overhead_w * factor)

    def outside(self, x: np.ndarray) -> list[str]:
        """The shape features of `x` far beyond anything fitted ("not enough steps like this")."""
        beyond = x[_SHAPE_INDEX] > self._reach
        return [SHAPE[i] for i in np.flatnonzero(beyond)] if beyond.any() else []

    @cached_property
    def _reach(self) -> np.ndarray:
        """How far each SHAPE feature may lie (the twin asks once a simulated step)."""
        return REACH * np.maximum(self.seen_max[_SHAPE_INDEX], 1.0)

    def describe(self) -> dict[str, Any]:
        return {
            "steps": self.num_steps,
            "mape": round(self.mape, 4),
            "residuals": self.residuals.describe(),
            "step_ms_per_unit": dict(zip(FEATURES, self.step_w.round(5).tolist(), strict=True)),
            "overhead_ms_per_unit": dict(
                zip(FEATURES, self.overhead_w.round(5).tolist(), strict=True)
            ),
        }


def knobs_after(knobs: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """The knobs in force at `step`: `knobs` (those before it) with every knob change it
    reports applied."""
    out = dict(knobs)
    for change in step.get("knob_changes") or ():
        out.update({k: new for k, (_, new) in change["changes"].items() if k in Knobs.model_fields})
    return out


def knobs_by_step(initial: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The knobs in force at each recorded step: the session's first knobs with every knob
    change applied from the step that reported it."""
    knobs, out = dict(initial), []
    for step in steps:
        knobs = knobs_after(knobs, step)
        out.append(knobs)
    return out


class Rows(NamedTuple):
    """Training rows: FEATURES, and the step time, its MoE part and the loop overhead (ms)."""

    x: np.ndarray
    step_ms: np.ndarray
    moe_ms: np.ndarray
    overhead_ms: np.ndarray


def training_row(
    prev: dict[str, Any], step: dict[str, Any], knobs: dict[str, Any]
) -> np.ndarray | None:
    """FEATURES then the step, MoE and overhead ms of `step` run under `knobs`, as one array;
    None unless it ran work right after `prev`, a busy step."""
    busy_before = sum(prev["queue"][q] for q in ("waiting", "running", "swapped")) > 0
    if not step["batch"]["slots"] or not busy_before or step["step"] != prev["step"] + 1:
        return None
    total = step["dur_ms"]["total"]
    x = recorded_features(step, knobs.get("expert_capacity_factor"))
    overhead = max(0.0, (step["t"] - prev["t"]) * 1000 - total)
    return np.concatenate([x, [total, min(step["dur_ms"]["moe"], total), overhead]])


def stack(rows: Sequence[np.ndarray]) -> Rows:
    """`training_row`s as Rows."""
    a = np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES) + 3)
    n = len(FEATURES)
    return Rows(a[:, :n], a[:, n], a[:, n + 1], a[:, n + 2])


def training_rows(steps: list[dict[str, Any]], knobs: list[dict[str, Any]]) -> Rows:
    """The rows of the steps that ran work right after a busy step."""
    pairs = zip(steps, steps[1:], knobs[1:], strict=False)
    return stack([r for p, s, k in pairs if (r := training_row(p, s, k)) is not None])


def fit(steps: list[dict[str, Any]], initial_knobs: dict[str, Any]) -> CostModel:
    """Fit from recorded StepTelemetry dicts (in step order) and the session's first knobs.

    Raises InvalidInput (`source`) when fewer than MIN_STEPS busy steps are there."""
    return fit_pooled([(steps, initial_knobs)])


def fit_pooled(sessions: Sequence[tuple[list[dict[str, Any]], dict[str, Any]]]) -> CostModel:
    """Fit on the steps of several sessions of one engine ((steps, first knobs) each), so the
    held-out errors carry the run-to-run variation between them and within each; InvalidInput
    as `fit`."""
    parts = [training_rows(steps, knobs_by_step(knobs, steps)) for steps, knobs in sessions]
    rows = Rows(*(np.concatenate(cols) for cols in zip(*parts, strict=True)))
    runs = np.concatenate([stretches(i, len(part.x)) for i, part in enumerate(parts)])
    return fit_rows(rows, runs)


def stretches(session: int, n: int) -> np.ndarray:
    """Run labels of a session's `n` rows in order: SEGMENTS stretches of time each, so that a
    run factor is drawn from the spread between stretches of a run (the machine's other work
    comes and goes within one) as well as between runs."""
    return session * SEGMENTS + np.arange(n) * SEGMENTS // max(n, 1)


def fit_rows(rows: Rows, runs: np.ndarray | None = None) -> CostModel:
    """Fit from training rows; InvalidInput (`source`) with fewer than MIN_STEPS. `runs` gives
    each row's run or stretch of one (default: one run, in order, cut into SEGMENTS
    stretches)."""
    x, step_ms, moe_ms, overhead_ms = rows
    if len(x) < MIN_STEPS:
        raise InvalidInput(
            f"a cost model needs at least {MIN_STEPS} busy steps that follow another; "
            f"the source has {len(x)}",
            "source",
        )
    if runs is None:
        runs = stretches(0, len(x))
    # the weights are fitted at one speed, the stretches' typical one: least squares over a
    # session 4x slower than another (a busy machine) took the slow one's costs and bent the
    # shapes toward its steps (benchmarks/control/twin_accuracy.py)
    speed = _speeds(rows, runs)
    typical = Rows(x, step_ms / speed, moe_ms / speed, overhead_ms / speed)
    held = np.arange(len(x)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    train = ~held
    w_step = _step_weights(x[train], typical.step_ms[train], typical.moe_ms[train])
    w_over = _fit(x[train], typical.overhead_ms[train], BATCH)
    period = step_ms[held] + overhead_ms[held]
    predicted = x[held] @ (w_step + w_over)
    mape = float(np.mean(np.abs(predicted - period) / np.maximum(period, 1e-3)))
    residuals = _residuals(x[held], period, predicted, runs[held])
    return CostModel(
        _step_weights(x, typical.step_ms, typical.moe_ms),
        _fit(x, typical.overhead_ms, BATCH),
        x.max(axis=0),
        mape,
        len(x),
        residuals,
    )


def _speeds(rows: Rows, runs: np.ndarray) -> np.ndarray:
    """Each row's stretch's speed relative to the median stretch's: the ratio of its measured
    periods to a fit's, the fit made on the rows at one speed, alternately (SPEED_PASSES)."""
    x, step_ms, moe_ms, overhead_ms = rows
    period = step_ms + overhead_ms
    index = np.unique(runs, return_inverse=True)[1].reshape(-1)
    speed = np.ones(len(x))
    for _ in range(SPEED_PASSES):
        w = _step_weights(x, step_ms / speed, moe_ms / speed) + _fit(x, overhead_ms / speed, BATCH)
        predicted = np.maximum(x @ w, 1e-3)
        factors = np.bincount(index, period) / np.maximum(np.bincount(index, predicted), 1e-9)
        speed = (factors / np.median(factors))[index]
    return speed


def _residuals(
    x: np.ndarray, measured: np.ndarray, predicted: np.ndarray, runs: np.ndarray
) -> Residuals:
    """The Residuals of held-out steps (their FEATURES, measured and predicted periods and
    runs)."""
    predicted = np.maximum(predicted, 1e-3)
    labels = np.unique(runs)
    factors = np.array([measured[runs == r].sum() / predicted[runs == r].sum() for r in labels])
    per_run = dict(zip(labels.tolist(), factors, strict=True))
    ratios = measured / predicted / np.array([per_run[r] for r in runs.tolist()])
    shapes: dict[tuple[int, ...], list[float]] = {}
    for row, ratio in zip(x, ratios, strict=True):
        shapes.setdefault(shape_key(row), []).append(float(ratio))
    by_shape = {k: np.array(v) for k, v in shapes.items() if len(v) >= MIN_POOL}
    return Residuals(factors, by_shape, ratios)


def _step_weights(x: np.ndarray, step_ms: np.ndarray, moe_ms: np.ndarray) -> np.ndarray:
    """The MoE time over the expert features plus the rest over the batch features."""
    return _fit(x, moe_ms, MOE) + _fit(x, step_ms - moe_ms, BATCH)


def _fit(x: np.ndarray, y: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Non-negative least squares over the `names` columns of `x` (zero weight elsewhere)."""
    cols = [FEATURES.index(n) for n in names]
    w = np.zeros(len(FEATURES))
    w[cols] = nnls(x[:, cols], y)[0]
    return w
