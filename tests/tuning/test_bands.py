"""A what-if's bands: several simulations that vary step costs by the fit's held-out errors
(per run and per step shape), expert loads and arrivals; each metric a median within its 80%
band, a band that widens with the residuals, and the share of simulations whose queue builds.
No model: the twins are fitted on synthetic steps."""

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from test_cost_model import fake_session
from test_whatif import CONFIG

from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.twin.bands import DRAWS, band, saturation
from tuning.twin.cost_model import Residuals, fit, fit_pooled
from tuning.twin.outcome import METRICS
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
    low, high = sorted(pooled.residuals.runs)
    assert high / low > 1.2  # the slower run's steps took 1.3x
    assert pooled.num_steps == 2 * alone.num_steps


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
