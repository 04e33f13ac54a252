"""The live cost model's rows: the same rows a recording gives while few, the cost of a shape
remembered long after the recent steps stopped showing it, and bounded memory."""

from typing import Any

import numpy as np
import pytest
from test_cost_model import TRUE_OVERHEAD, TRUE_STEP, _cost, fake_session

import tuning.twin.fit_rows
from tuning.twin.cost_model import fit, fit_rows, knobs_by_step, stack, training_rows
from tuning.twin.features import FEATURES, recorded_features
from tuning.twin.fit_rows import PER_SHAPE, FitRows


def step(i: int, t: float, prefill: int, decodes: int) -> dict[str, Any]:
    """A busy step of one `prefill`-token chunk (none at 0) and `decodes` decodes, costing
    TRUE_STEP; its time `t` is set by `session`."""
    slots = [{"phase": "prefill", "tokens": prefill, "ctx": prefill}] if prefill else []
    slots += [{"phase": "decode", "tokens": 1, "ctx": 100 + d} for d in range(decodes)]
    tokens = prefill + decodes
    counts = np.full((4, 8), tokens * 2 // 8)
    out = {
        "step": i,
        "t": t,
        "batch": {"slots": slots, "num_prefill_tokens": prefill, "num_decode_tokens": decodes},
        "experts": {"counts": counts.tolist(), "top_k": 2, "experts": 8, "layers": 4},
        "a2a": {"ep_size": 1, "bytes": [[0]], "gather_bytes": [[0]]},
        "queue": {"waiting": 1, "running": decodes, "swapped": 0},
        "knob_changes": [],
    }
    x = recorded_features(out, None)
    out["dur_ms"] = {"total": _cost(TRUE_STEP, x), "moe": 0.5 * x[FEATURES.index("expert_pairs_k")]}
    return out


def session(shapes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    steps, t = [], 100.0
    for i, (prefill, decodes) in enumerate(shapes):
        s = step(i, t, prefill, decodes)
        t += (s["dur_ms"]["total"] + _cost(TRUE_OVERHEAD, recorded_features(s, None))) / 1000
        s["t"] = t
        steps.append(s)
    return steps


def test_while_few_the_rows_are_those_a_recording_of_the_same_steps_gives() -> None:
    steps = fake_session(300)
    steps[100]["knob_changes"] = [{"changes": {"expert_capacity_factor": [None, 1.0]}}]
    rows = FitRows({"expert_capacity_factor": None})
    for s in steps:
        rows.add(s)
    live = stack(rows.rows())
    recorded = training_rows(steps, knobs_by_step({"expert_capacity_factor": None}, steps))
    for a, b in zip(live, recorded, strict=True):
        np.testing.assert_array_equal(a, b)
    assert rows.knobs["expert_capacity_factor"] == 1.0


def test_a_prefill_long_gone_from_the_recent_steps_is_still_predicted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning.twin.fit_rows, "RECENT", 300)
    prefills = [(p, d) for p in (64, 256, 1024) for d in range(1, 40, 3)] * 4
    steps = session(prefills + [(0, 1 + i % 40) for i in range(1000)])
    rows = FitRows({})
    for s in steps:
        rows.add(s)
    model = fit_rows(stack(rows.rows()))
    long_chunk = recorded_features(step(0, 0.0, 1024, 8), None)
    truth = _cost(TRUE_STEP, long_chunk)
    assert model.step_ms(long_chunk) == pytest.approx(truth, rel=0.02)
    # the recent steps alone hold no prefill to learn its cost from
    recent = fit(steps[-300:], {})
    assert recent.step_ms(long_chunk) < 0.5 * truth


def test_seeded_rows_predict_a_shape_until_this_runs_own_steps_replace_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuning.twin.fit_rows, "RECENT", 300)
    prefills = [(p, d) for p in (64, 256, 1024) for d in range(1, 40, 3)]
    earlier = FitRows({})
    for s in session(prefills * 4):
        earlier.add(s)
    rows = FitRows({})
    rows.seed(earlier.rows())
    for s in session([(0, 1 + i % 40) for i in range(100)]):
        rows.add(s)
    long_chunk = recorded_features(step(0, 0.0, 1024, 8), None)
    truth = _cost(TRUE_STEP, long_chunk)
    assert fit_rows(stack(rows.rows())).step_ms(long_chunk) == pytest.approx(truth, rel=0.02)
    # this run's own steps of those shapes, twice as slow, supersede the earlier run's
    for s in session(prefills * 40):
        s["dur_ms"] = {k: 2 * v for k, v in s["dur_ms"].items()}
        rows.add(s)
    assert fit_rows(stack(rows.rows())).step_ms(long_chunk) == pytest.approx(2 * truth, rel=0.02)


def test_memory_is_bounded_by_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning.twin.fit_rows, "RECENT", 50)
    monkeypatch.setattr(tuning.twin.fit_rows, "MAX_SHAPES", 3)
    rows = FitRows({})
    for s in session([(2**k, 4) for k in range(1, 9) for _ in range(40)] + [(0, 4)] * 50):
        rows.add(s)
    assert len(rows.recent) == 50
    assert len(rows.older) == 3
    assert all(len(kept) <= PER_SHAPE for kept in rows.older.values())
    # the shapes seen last are kept: the largest chunks, 64, 128 and 256 tokens
    assert sorted(shape[0] for shape in rows.older) == [6, 7, 8]
