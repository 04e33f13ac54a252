"""benchmarks/control/autopilot.py runs end to end on the tiny model and reports every target."""

from pathlib import Path

import pytest

from benchmarks.control import autopilot as bench
from benchmarks.harness.results_md import markers
from cli.loadgen import load_trace

pytestmark = pytest.mark.slow  # four real servers replay a 12 s trace


def test_quick_run_scores_every_kind_of_run(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    trace = tmp_path / "trace.jsonl"
    out = bench.main(["--quick", "--results", str(results), "--save-trace", str(trace)])
    assert len(load_trace(trace)) == out["requests"]  # the file `moescope load` replayed
    kinds = [r["kind"] for r in out["runs"]]
    assert kinds == list(bench.KINDS)
    for r in out["runs"]:
        assert r["errors"] == 0 and r["requests"] == out["requests"]
        assert sum(p["requests"] for p in r["phases"]) == out["requests"]
        assert r["attainment"] is not None and 0 <= r["attainment"] <= 100
    assert set(out["summary"]["met"]) == set(bench.TARGETS)
    text = results.read_text()
    assert all(text.count(m) == 1 for m in markers(bench.SECTION))
    assert text.count("[met]") + text.count("[MISSED]") == len(bench.TARGETS)
    med = out["summary"]["median_attainment"]
    assert out["summary"]["room"] == pytest.approx(100 - med["defaults"])
    assert f"room above the defaults on this trace: {out['summary']['room']:.1f} points" in text
    assert "- run 1:" in text  # the autopilot's changes, each with its reason
    fitted, cold = out["runs"][2:]
    assert fitted["fit_from"]["session"] == out["runs"][0]["session"]
    assert cold["fit_from"] is None
    for pilot in out["runs"][2:]:
        assert pilot["notes"] and all(n["state"] != "off" for n in pilot["notes"])
    assert all(f"  - {phase} (" in text for phase in bench.PHASES)  # what it said, per phase
    for kind in bench.KINDS:  # the per-phase table: a row for each kind of run and phase
        assert all(f"| {kind} | {phase} | " in text for phase in bench.PHASES)


def test_the_long_prompt_rate_is_a_share_of_the_prefill_rate_measured() -> None:
    args = bench.parse_args(["--model", "synthetic:tiny", "--long-prompt-len", "fixed:300"])
    tok_s = bench.prefill_rate(args)
    assert 100 < tok_s < 1e7  # the probe prefilled its prompts, and took time doing so
    assert bench.long_rate(args, tok_s) == pytest.approx(bench.LONG_LOAD * tok_s / 300)
