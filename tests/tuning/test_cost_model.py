"""The step-cost model: it recovers known costs, measures its error on held-out steps, refuses
to fit too little and flags steps far beyond what it saw."""

import random
from typing import Any

import numpy as np
import pytest

from engine.errors import InvalidInput
from tuning.twin.cost_model import MIN_STEPS, fit, knobs_by_step
from tuning.twin.features import FEATURES, recorded_features

# ms per unit: 1 per step, 0.02 per prefill token, 0.3 per decode sequence, 0.5 per thousand
# pairs in the MoE layers; the loop adds 0.4 ms per step and 0.05 per decode sequence
TRUE_STEP = {"const": 1.0, "prefill_tokens": 0.02, "decode_seqs": 0.3, "expert_pairs_k": 0.5}
TRUE_OVERHEAD = {"const": 0.4, "decode_seqs": 0.05}


def fake_step(i: int, t: float, rng: random.Random, factor_change: bool = False) -> dict[str, Any]:
    prefill = [rng.randrange(8, 300) for _ in range(rng.randrange(0, 3))]
    decodes = rng.randrange(1, 40)
    slots = [{"phase": "prefill", "tokens": n, "ctx": n} for n in prefill] + [
        {"phase": "decode", "tokens": 1, "ctx": rng.randrange(10, 500)} for _ in range(decodes)
    ]
    tokens = sum(prefill) + decodes
    counts = np.random.default_rng(i).multinomial(tokens * 2, [1 / 8] * 8, size=4)
    step = {
        "step": i,
        "t": t,
        "batch": {"slots": slots, "num_prefill_tokens": sum(prefill), "num_decode_tokens": decodes},
        "experts": {"counts": counts.tolist(), "top_k": 2, "experts": 8, "layers": 4},
        "a2a": {"ep_size": 1, "bytes": [[0]], "gather_bytes": [[0]]},
        "queue": {"waiting": 1, "running": decodes, "swapped": 0},
        "knob_changes": [],
    }
    x = recorded_features(step, None)
    moe = 0.5 * x[FEATURES.index("expert_pairs_k")]
    step["dur_ms"] = {"total": _cost(TRUE_STEP, x), "moe": moe}
    return step


def _cost(weights: dict[str, float], x: np.ndarray) -> float:
    return sum(w * x[FEATURES.index(name)] for name, w in weights.items())


def fake_session(n: int) -> list[dict[str, Any]]:
    rng, steps, t = random.Random(0), [], 100.0
    for i in range(n):
        step = fake_step(i, t, rng)
        x = recorded_features(step, None)
        t += (step["dur_ms"]["total"] + _cost(TRUE_OVERHEAD, x)) / 1000
        step["t"] = t
        steps.append(step)
    return steps


def test_fit_recovers_the_costs_that_made_the_steps() -> None:
    model = fit(fake_session(300), {})
    assert model.num_steps == 299  # the first step has no busy step before it
    assert model.mape < 0.01
    x = recorded_features(fake_step(999, 0.0, random.Random(5)), None)
    expected = _cost(TRUE_STEP, x) + _cost(TRUE_OVERHEAD, x)
    assert model.period_ms(x) == pytest.approx(expected, rel=0.01)
    assert model.step_ms(x) == pytest.approx(_cost(TRUE_STEP, x), rel=0.01)
    assert model.outside(x) == []


def test_off_by_its_error_stretches_every_step_by_the_held_out_error() -> None:
    steps = fake_session(300)
    for step in steps[::7]:  # some steps 30% slower than the costs say: a fit with some error
        step["dur_ms"]["total"] *= 1.3
    model = fit(steps, {})
    assert 0.01 < model.mape < 0.3
    x = recorded_features(fake_step(999, 0.0, random.Random(5)), None)
    for errors in (-1.0, 1.0, 2.0):
        off = model.off_by(errors)
        factor = 1 + errors * model.mape
        assert off.step_ms(x) == pytest.approx(factor * model.step_ms(x))
        assert off.period_ms(x) == pytest.approx(factor * model.period_ms(x))
        assert off.mape == model.mape and off.outside(x) == model.outside(x)
    assert model.off_by(0.0).period_ms(x) == model.period_ms(x)
    assert model.off_by(-1e9).step_ms(x) == 0.0  # never negative


def test_too_few_steps_are_refused_naming_the_number_needed() -> None:
    with pytest.raises(InvalidInput, match=f"at least {MIN_STEPS}") as refused:
        fit(fake_session(MIN_STEPS // 2), {})
    assert refused.value.param == "source"


def test_a_step_far_beyond_the_recording_is_flagged() -> None:
    model = fit(fake_session(200), {})
    x = np.array(model.seen_max)
    x[FEATURES.index("decode_seqs")] *= 10
    assert model.outside(x) == ["decode_seqs"]


def test_knob_changes_apply_from_the_step_that_reports_them() -> None:
    steps = [
        {"knob_changes": []},
        {
            "knob_changes": [
                {"changes": {"expert_capacity_factor": [None, 1.0], "expert_placement": [1, 2]}}
            ]
        },
        {},
    ]
    timeline = knobs_by_step({"expert_capacity_factor": None}, steps)
    assert [k["expert_capacity_factor"] for k in timeline] == [None, 1.0, 1.0]
    assert all("expert_placement" not in k for k in timeline)
