"""A what-if's bands: several simulations that vary step costs by the fit's held-out errors
(per run and per step shape), expert loads and arrivals; each metric a median within its 80%
band, a band that widens with the residuals, and the share of simulations whose queue builds.
No model: the twins are fitted on synthetic steps."""

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from test_cost_model import TRUE_OVERHEAD, TRUE_STEP, _cost, fake_session
from test_whatif import CONFIG

from engine.errors import InvalidInput
from engine.knobs import Knobs
from engine.telemetry import RequestRecord
from tuning.twin.bands import DRAWS, band, builds, saturation
from tuning.twin.cost_model import SEGMENTS, Residuals, fit, fit_pooled
from tuning.twin.features import FEATURES, recorded_features
from tuning.twin.outcome import METRICS
from tuning.twin.simulator import Cut, SimResult
from tuning.twin.trace import TraceItem
from tuning.twin.whatif import Twin, twin_from_recording, twin_from_recordings

SESSION = {"config": CONFIG, "knobs": Knobs().model_dump()}


def records(
    rate: float, seconds: float, prompt: int = 64, output: int = 24
) -> list[dict[str, Any]]:
    """Requests arriving evenly at `rate` a second for `seconds`."""
    return [
        {"arrival": 100.0 + i / rate, "prompt_len": prompt, "output_len": output, "finished_t": 0.0}
        for i in range(int(rate * seconds))
    ]


def twin(rate: float = 20.0, seconds: float = 4.0) -> Twin:
    return twin_from_recording(SESSION, fake_session(300), records(rate, seconds))


def slower(steps: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    """The same steps, each `factor` times as long (a run on a busier machine)."""
    out, t = [], steps[0]["t"]
    for prev, step in zip([steps[0], *steps], steps, strict=False):
        t += factor * (step["t"] - prev["t"])
        dur = {k: factor * v for k, v in step["dur_ms"].items()}
        out.append({**step, "t": t, "dur_ms": dur})
    return out


def width(side: dict[str, Any], metric: str) -> float:
    low, high = side["bands"][metric]
    return float(high - low)


def test_every_metric_is_a_median_within_its_band() -> None:
    answer = twin().compare({"max_num_seqs": 4})
    assert answer["draws"] == DRAWS
    for side in (answer["current"], answer["candidate"]):
        for metric in (*METRICS, "unfinished"):
            low, high = side["bands"][metric]
            if side[metric] is not None:
                assert low <= side[metric] <= high, metric
        assert side["saturation"]["draws"] == DRAWS
    assert band([3.0, 1.0, 2.0, None]) == (2.0, [1.2, 2.8])
    assert band([None]) == (None, [None, None])


def test_bands_widen_with_the_fits_residual_spread() -> None:
    base = twin()
    narrow = Residuals(np.array([0.99, 1.01]), {}, np.array([0.98, 1.0, 1.02]))
    wide = Residuals(np.array([0.7, 1.4]), {}, np.array([0.6, 1.0, 1.6]))
    sides = [
        replace(base, model=replace(base.model, residuals=r)).predict({}) for r in (narrow, wide)
    ]
    for metric in ("ttft_p50_ms", "tpot_p50_ms", "tpot_p90_ms"):
        assert width(sides[1], metric) > 2 * width(sides[0], metric), metric


def test_a_saturated_setting_is_flagged_and_a_light_one_is_not() -> None:
    """200 requests in 4 s: one slot serves a request in about 20 steps of 1-2 ms, far fewer
    than arrive; 64 slots keep up."""
    tw = twin(50.0, 4.0)
    light, saturated = tw.predict({}), tw.predict({"max_num_seqs": 1})
    assert light["saturation"]["builds"] == 0
    assert light["saturation"]["text"] == f"the queue stays bounded in all {DRAWS} simulations"
    assert saturated["saturation"]["builds"] == DRAWS
    assert saturated["saturation"]["text"].startswith("saturated: the queue builds in all")
    assert saturated["ttft_p90_ms"] > 10 * light["ttft_p90_ms"]


def test_a_setting_on_the_knee_is_flagged_in_words() -> None:
    knee = saturation([True] * 4 + [False] * 6)
    assert knee["share"] == 0.4
    assert knee["text"] == (
        "within the noise of saturation: the queue builds in 4 of 10 simulations"
    )


def test_a_pooled_fit_carries_the_run_to_run_variation() -> None:
    steps = fake_session(300)
    alone = fit(steps, {})
    # one run fitted: its stretches all ran alike (the synthetic steps cost what they cost)
    assert np.ptp(alone.residuals.runs) < 0.05
    pooled = fit_pooled([(steps, {}), (slower(steps, 1.3), {})])
    fast, slow = np.split(pooled.residuals.runs, 2)  # each run's SEGMENTS stretches
    assert len(fast) == SEGMENTS and slow.min() / fast.max() > 1.2  # the slower run took 1.3x
    assert pooled.num_steps == 2 * alone.num_steps


def test_one_run_carries_the_variation_between_its_stretches() -> None:
    """A session whose second half ran 1.5x slower (other work on the machine): its stretches'
    factors differ by that, and a what-if's band widens with them."""
    steps = fake_session(300)
    half = len(steps) // 2
    uneven = steps[:half] + slower(steps[half - 1 :], 1.5)[1:]
    even, varied = fit(steps, {}), fit(uneven, {})
    assert np.ptp(varied.residuals.runs) > 0.3 > np.ptp(even.residuals.runs)
    base = twin()
    sides = [replace(base, model=m).predict({}) for m in (even, varied)]
    assert width(sides[1], "tpot_p50_ms") > 2 * width(sides[0], "tpot_p50_ms")


def test_sessions_of_one_engine_pool_and_of_another_are_refused() -> None:
    steps = fake_session(300)
    first = (SESSION, steps, records(20.0, 2.0))
    second = (SESSION, slower(steps, 1.3), records(5.0, 1.0))
    pooled = twin_from_recordings([first, second])
    assert pooled.sessions == 2 and len(pooled.trace) == 40  # the first one's trace
    config: dict[str, Any] = copy.deepcopy(CONFIG)
    config["model_config"]["num_experts"] = 16
    with pytest.raises(InvalidInput, match="different engines") as refused:
        twin_from_recordings([first, ({**SESSION, "config": config}, steps, records(5.0, 1.0))])
    assert refused.value.param == "source"


def ended(arrival: float, wait_ms: float, tpot_ms: float = 5.0, output: int = 11) -> RequestRecord:
    """A request that arrived at `arrival` s, waited `wait_ms` for its first token and then
    took `tpot_ms` a token."""
    e2e = wait_ms + tpot_ms * (output - 1)
    return RequestRecord(
        req=f"r{arrival}",
        arrival=arrival,
        finished_t=arrival + e2e / 1000,
        prompt_len=16,
        output_len=output,
        max_tokens=output,
        ttft_ms=wait_ms,
        finish_reason="length",
        preemptions=0,
        e2e_ms=e2e,
    )


def test_the_queue_builds_when_later_arrivals_wait_longer_not_when_all_wait_long() -> None:
    """Arrivals over 9 s: a wait that grows from 20 ms to 400 ms is a queue building; 400 ms
    from the start is a long wait, not a queue that builds; 2 ms to 30 ms is within 10 steps
    of 5 ms (cut off at a horizon, the unfinished count as far as they got); bursts that
    drain are no queue building, long waits that come only later are."""
    items = [TraceItem(t / 10, 16, 11) for t in range(90)]

    def result(waits: list[float], cut_after: int | None = None) -> SimResult:
        done = [ended(t.offset_s, w) for t, w in zip(items, waits, strict=True)]
        end_s = 9.5
        cut = [Cut(None, None, 1000 * (end_s - r.arrival)) for r in done[cut_after or len(done) :]]
        out = SimResult(done[: cut_after or len(done)], [], len(cut), 0, 0, 0, 0, 0, 0)
        out.end_s, out.cut = end_s, cut
        return out

    rising = [20 + 380 * i / 89 for i in range(90)]
    assert builds(result(rising), items)
    assert not builds(result([400.0] * 90), items)
    assert not builds(result([2 + 28 * i / 89 for i in range(90)]), items)  # 4x, 20 ms
    # the last third never got its first token: it waited 0.5 s and more when cut off
    assert builds(result([20.0] * 90, cut_after=60), items)
    # a live twin's snapshot: requests that arrived long before it count with the first stretch
    early = result(rising)
    early.records += [ended(-30.0 - i, 20.0) for i in range(5)]
    assert builds(early, items)
    # bursts every 3 s that queue and drain again: a long wait now and then, no trend
    bursty = [300.0 if (t.offset_s - 1.0) % 3.0 < 0.6 else 20.0 for t in items]
    assert not builds(result(bursty), items)
    # a few requests of the last third preempted again and again: the median wait stays, the
    # mean grows (a KV cap's thrash)
    thrash = [3000.0 if i >= 60 and i % 4 == 0 else 20.0 for i in range(90)]
    assert builds(result(thrash), items)


def decode_only(steps: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    """`steps` without their prefills, each `factor` times the true cost (a busy machine)."""
    out, t = [], steps[0]["t"]
    for step in steps:
        slots = [s for s in step["batch"]["slots"] if s["phase"] == "decode"]
        batch = {"slots": slots, "num_prefill_tokens": 0, "num_decode_tokens": len(slots)}
        x = recorded_features({**step, "batch": batch}, None)
        total = factor * _cost(TRUE_STEP, x)
        t += (total + factor * _cost(TRUE_OVERHEAD, x)) / 1000
        moe = factor * 0.5 * x[FEATURES.index("expert_pairs_k")]
        out.append({**step, "t": t, "batch": batch, "dur_ms": {"total": total, "moe": moe}})
    return out


def test_a_slower_session_scales_the_pooled_fit_without_bending_it() -> None:
    """Pooled with a session of other steps (decodes only) that ran 3x slower throughout, the
    fit keeps the true costs' proportions, at one speed between the two sessions', and its
    stretches carry the 3x. Fitted as they came, the slow decodes took the fast prefills'
    share of the cost."""
    steps = fake_session(300)
    pooled = fit_pooled([(steps, {}), (decode_only(steps, 3.0), {})])
    true = np.array([TRUE_STEP.get(name, 0.0) for name in FEATURES])
    scale = pooled.step_w[0] / true[0]
    assert 1.0 <= scale <= 3.0
    np.testing.assert_allclose(pooled.step_w, scale * true, rtol=0.1, atol=0.005)
    fast, slow = np.split(pooled.residuals.runs, 2)
    assert slow.min() / fast.max() == pytest.approx(3.0, rel=0.05)
