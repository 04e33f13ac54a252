"""Smoke test: the twin benchmark records a session, predicts and reruns its settings on the tiny
model, and judges every prediction."""

import math
from typing import Any

import pytest

from benchmarks.control import twin as bench

POSITIVE = ("throughput_tok_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")


def check_setting(j: dict[str, Any]) -> None:
    """A setting's prediction and its one rerun are numbers of the right sign, judged."""
    [run] = j["reruns"]
    assert run["wall_s"] > 0 and j["rerun_s"] == run["wall_s"]
    assert j["sim_s"] > 0 and j["sim_steps"] > 0 and j["speed"] == j["rerun_s"] / j["sim_s"]
    for metric in bench.METRICS:
        c = j["cells"][metric]
        assert c["runs"] == [run[metric]] and c["median"] == run[metric] and c["spread"] == 0
        assert c["predicted"] == j["metrics"][metric]
        low = 0 if metric not in POSITIVE else 1e-9
        assert c["predicted"] >= low and c["median"] >= low, metric
        assert c["within"] == (c["error"] <= bench.NOISE_SHARE * c["median"])
    assert j["cells"]["peak_kv_blocks"]["median"] > 0
    assert 0 <= j["drop"]["predicted"] <= 1 and 0 <= j["drop"]["median"] <= 1


@pytest.mark.slow
def test_quick_run_predicts_reruns_and_judges() -> None:
    out = bench.main(["--quick"])
    assert out["capacity_req_s"] > 0
    [session] = out["sessions"]
    assert session["name"] == "near" and session["requests"] == session["load_summary"]["ok"]
    assert session["recorded"]["steps"] > 0 and session["recorded"]["throughput_tok_s"] > 0
    for part in (session, session["from_recording"]):
        assert part["fit"]["steps"] >= 40 and part["fit"]["mape"] >= 0
        settings = part["settings"]
        assert list(settings)[0] == "defaults" and len(settings) == bench.QUICK_SETTINGS
        for j in settings.values():
            check_setting(j)
        assert set(part["ranking"]) == set(bench.METRICS)
    first = session["settings"]
    assert {j["reruns"][0]["session"] for j in first.values()} == {
        j["reruns"][0]["session"] for j in session["from_recording"]["settings"].values()
    }
    # the judged twin learns from a rerun of its own, neither the recording nor a measured one
    measured = {run["session"] for j in first.values() for run in j["reruns"]}
    source = session["fit"]["session"]
    assert source not in measured and source != session["recorded"]["session"]
    assert session["from_recording"]["fit"]["session"] == session["recorded"]["session"]
    for verdict in (out, out["from_recording"]):
        assert set(verdict["targets"]) == set(bench.TARGETS)
        for key, t in verdict["targets"].items():
            value = t["value"]
            assert t["met"] == (value is not None and bench.TARGETS[key].met(value))
            assert value is None or not math.isnan(value)
