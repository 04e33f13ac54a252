"""The simulator coasts through the steps whose scheduling is known (every running request
decodes) without asking the scheduler, with the same outcome as stepping through each: what
it would do while keeping every step's telemetry."""

import random
from typing import Any

import numpy as np
import pytest
from test_attribution import Cost

from engine.config import CacheConfig
from engine.ep.placement import Placement
from engine.knobs import Knobs
from engine.scheduler import Scheduler
from tuning.twin.bands import NoisyCost
from tuning.twin.cost_model import Residuals
from tuning.twin.experts import ExpertDraw, routing
from tuning.twin.simulator import Setup, SimResult, StepCost, simulate
from tuning.twin.trace import TraceItem

KNOB_SETS = [
    {},
    {"max_num_seqs": 3, "max_num_batched_tokens": 48, "prefill_chunk_size": 16},
    {"max_num_seqs": 5, "policy": "shortest_first", "preemption_mode": "swap"},
    {"max_num_seqs": 6, "policy": "priority", "kv_watermark": 0.1},
    {"kv_capacity_blocks": 20},
    {"kv_capacity_blocks": 20, "preemption_mode": "swap", "policy": "shortest_first"},
    {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 12,
        "prefill_chunk_size": 8,
        "kv_capacity_blocks": 24,
    },
]
# loads of sizes 1 to 4 tokens over two layers of four experts; other sizes are drawn
ROUTED = [
    {"experts": {"counts": [[n, n, 0, 0], [0, n, n, 0]], "top_k": 2}} for n in (1, 2, 3, 4, 2)
]


def trace(seed: int) -> list[TraceItem]:
    """40 requests over about 0.4 s: a queue forms for slots and KV blocks, and drains."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(40):
        t += rng.expovariate(100.0)
        out.append(TraceItem(t, rng.randrange(3, 70), rng.randrange(2, 40), rng.randrange(-2, 3)))
    return out


def setup(caching: bool) -> Setup:
    cache = CacheConfig(
        block_size=8, num_blocks=40, num_host_blocks=40, enable_prefix_caching=caching
    )
    return Setup(cache, "continuous", Placement.contiguous(2, 4, 1), 64, 4096)


def noisy(seed: int) -> NoisyCost:
    """Step costs with a run factor and a per-shape error, drawn by `seed`."""
    ratios = np.array([0.6, 0.9, 1.0, 1.1, 1.7])
    residuals = Residuals(np.array([0.8, 1.3]), {(0, 0, 1, 0, 0): ratios[::-1]}, ratios)
    return NoisyCost(
        Cost(1.0, per_prefill=0.02, per_decode=0.3), residuals, np.random.default_rng(seed)
    )


def outcome(result: SimResult) -> dict[str, Any]:
    return {
        "records": [r.model_dump() for r in result.records],
        "cut": result.cut,
        "totals": (result.unfinished, result.peak_kv_blocks, result.preemptions),
        "pairs": (result.routed_pairs, result.dropped_pairs),
        "steps": (result.num_steps, result.outside_steps),
        "end_s": result.end_s,
    }


def run(
    items: list[TraceItem], knobs: Knobs, caching: bool, cost: StepCost, keep: bool, **kw: Any
) -> tuple[dict[str, Any], int]:
    """The outcome, and how many times the scheduler was asked."""
    asked = 0
    schedule = Scheduler.schedule

    def counted(self: Scheduler) -> Any:
        nonlocal asked
        asked += 1
        return schedule(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scheduler, "schedule", counted)
        draw = ExpertDraw(routing(ROUTED))
        result = simulate(items, knobs, setup(caching), cost, draw, keep_steps=keep, **kw)
    return outcome(result), asked


@pytest.mark.parametrize("knobs", KNOB_SETS)
@pytest.mark.parametrize(("seed", "caching"), [(0, False), (1, True), (2, True)])
def test_coasting_gives_what_stepping_gives(
    knobs: dict[str, Any], seed: int, caching: bool
) -> None:
    full = Knobs.model_validate({**Knobs().model_dump(), **knobs, "expert_capacity_factor": 1.0})
    items = trace(seed)
    for cost, horizon in ((Cost(1.0, 0.02, 0.3, gap=0.1), None), (noisy(seed), 0.3)):
        stepped, asked_stepping = run(items, full, caching, cost, True, horizon_s=horizon)
        coasted, asked_coasting = run(items, full, caching, cost, False, horizon_s=horizon)
        assert _same(coasted, stepped)
        assert asked_coasting < asked_stepping  # it did coast


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, floats within rounding (costed together, a row's sums may round otherwise)."""
    assert a.keys() == b.keys()
    for key in a:
        assert repr(a[key]) == repr(b[key]) or _close(a[key], b[key]), key
    return True


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-9)
    return bool(a == b)
