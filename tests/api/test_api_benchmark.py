"""Smoke test: the serving benchmark runs end to end on the tiny model."""

from pathlib import Path

import pytest

from benchmarks.harness.results_md import markers
from benchmarks.speed import serving as bench


@pytest.mark.slow
def test_quick_run_measures_rates_and_overhead(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    out = bench.main(["--quick", "--results", str(results)])
    [rate] = out["rates"]
    assert rate["rate"] == 4 and rate["requests"] == rate["ok"] == 6 and rate["steps"] > 0
    assert rate["ttft_ms"]["count"] == 6 and rate["tpot_ms"]["p50"] > 0
    ov = out["overhead"]
    assert [len(ov["runs"][m]) for m in ("off", "on")] == [1, 1]  # --quick: one pair
    assert ov["runs"]["on"][0]["messages"] > 0 and ov["ratio"] > 0
    target = out["targets"]["overhead"]
    assert target["value"] == ov["ratio"] and target["met"] == (ov["ratio"] <= 1.03)
    text = results.read_text()
    assert "kept" in text and all(text.count(m) == 1 for m in markers(bench.SECTION))
