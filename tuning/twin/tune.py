"""Tuning in simulation: a grid of sensible values per knob, each setting run in the twin and
scored by goodput and SLO attainment against an SLO."""

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import stats
from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.twin.bands import banded
from tuning.twin.outcome import METRICS, slo_scores
from tuning.twin.trace import TraceItem
from tuning.twin.whatif import Twin

SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)  # around the session's own value
DEFAULT_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_size", "policy")
SEARCHED = (
    *DEFAULT_KNOBS,
    "preemption_mode",
    "kv_watermark",
    "kv_capacity_blocks",
    "expert_capacity_factor",
)


def _scaled(value: int, low: int, high: int) -> list[int]:
    return sorted({min(high, max(low, round(value * s))) for s in SCALES})


def knob_values(
    name: str, knobs: Knobs, context: dict[str, Any], trace: list[TraceItem]
) -> list[Any]:
    """The values tried for knob `name` from the session's `knobs` and `trace`; InvalidInput
    for a knob that is not searched."""
    if name == "max_num_seqs":
        return _scaled(knobs.max_num_seqs, 1, 4096)
    if name == "max_num_batched_tokens":
        return _scaled(knobs.max_num_batched_tokens, 1, 1 << 20)
    if name == "prefill_chunk_size":
        return [0, *_scaled(knobs.prefill_chunk_size or 512, 1, 1 << 20)]
    if name == "policy":
        # without priorities in the trace, `priority` orders as fcfs does
        return ["fcfs", "shortest_first", *(["priority"] if any(t.priority for t in trace) else [])]
    if name == "preemption_mode":
        return ["recompute", "swap"]
    if name == "kv_watermark":
        return [0.0, 0.01, 0.05, 0.1]
    if name == "kv_capacity_blocks":
        total = context["total_blocks"]
        return sorted({max(1, round(total * s)) for s in (0.25, 0.5, 0.75)} | {total})
    if name == "expert_capacity_factor":
        return [None, 1.0, 1.25, 1.5, 2.0]
    raise InvalidInput(
        f"{name}: not a knob tune searches (it searches: {', '.join(SEARCHED)})", name
    )


def candidates(twin: Twin, names: list[str], trials: int, seed: int = 0) -> list[dict[str, Any]]:
    """Valid settings of the knobs `names` (each a dict of changes, the twin's own first): the
    whole grid, or `trials` of it drawn at random (seeded) when it is larger."""
    grid = [twin.knobs.model_dump(include=set(names))]
    values = [knob_values(name, twin.knobs, twin.context, twin.trace) for name in names]
    for combo in itertools.product(*values):
        changes = dict(zip(names, combo, strict=True))
        if changes != grid[0] and _valid(twin, changes):
            grid.append(changes)
    rest = grid[1:]
    if len(rest) > trials:
        rest = random.Random(seed).sample(rest, trials)
    return [grid[0], *rest]


def _valid(twin: Twin, changes: dict[str, Any]) -> bool:
    try:
        twin.candidate(changes)
    except InvalidInput:
        return False
    return True


@dataclass
class Trial:
    """One setting run in the twin: its banded outcome and median scores (their bands are in
    the outcome's `bands`), or why it could not be predicted; `per_draw` holds a Trial of each
    of the twin's simulations (the nominal one first), so that two settings can be compared
    draw by draw (each draw meets both the same way)."""

    changes: dict[str, Any]
    outcome: dict[str, Any] | None = None
    goodput_rps: float | None = None
    slo_attainment: float | None = None
    refused: str | None = None
    per_draw: list["Trial"] = field(default_factory=list)

    @property
    def builds(self) -> float:
        """The share of the twin's simulations in which the queue built (0 unscored)."""
        return float((self.outcome or {}).get("saturation", {}).get("share", 0.0))


def evaluate(
    twin: Twin, changes: dict[str, Any], slo: stats.SLO, horizon_s: float | None = None
) -> Trial:
    """Run one setting over the twin's draws; a setting far beyond the recorded steps is
    refused, not scored."""
    try:
        knobs = twin.candidate(changes)
        outcomes, built = twin.outcomes(knobs, horizon_s)
    except InvalidInput as exc:
        return Trial(changes, refused=str(exc))
    scores = [slo_scores(o, slo) for o in outcomes]
    draws = [
        Trial(changes, o, s["goodput_rps"], s["slo_attainment"])
        for o, s in zip(outcomes, scores, strict=True)
    ]
    each = [{**o, **s} for o, s in zip(outcomes, scores, strict=True)]
    side = banded(each, built, (*METRICS, "unfinished", *scores[0]))
    result = {"knobs": knobs.model_dump(), **side}
    return Trial(changes, result, result["goodput_rps"], result["slo_attainment"], None, draws)


def best(trials: list[Trial], by: str) -> Trial | None:
    """The scored trial with the highest `by` (goodput_rps or slo_attainment), the other score
    breaking ties; None when none was scored."""
    other = "slo_attainment" if by == "goodput_rps" else "goodput_rps"
    scored = [t for t in trials if t.outcome is not None]
    return max(
        scored,
        key=lambda t: (getattr(t, by) or 0.0, getattr(t, other) or 0.0),
        default=None,
    )
