"""Smoke test: benchmarks/dashboard_bench.py runs end to end in its quick mode."""

from pathlib import Path

import dashboard_bench as bench  # benchmarks/ is on pytest's pythonpath
import pytest

pytestmark = pytest.mark.slow


def test_dashboard_benchmark_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# Results\n\nbefore\n\n{bench.BEGIN}\nold\n{bench.END}\n\nafter\n")
    res = bench.main(["--quick", "--results", str(results)])
    assert res["lag"]["samples"] > 0 and res["lag"]["steps_per_s"] > 0
    assert res["render"]["frames"] > 0 and res["render"]["build_ms"] > 0
    for mode in bench.MODES:
        assert res["overhead"][mode]["wall"] > 0 and res["overhead"][mode]["cpu"] > 0
        assert res["overhead"][mode]["server"] >= 0
    assert res["overhead"][bench.DASHBOARD]["consumer"] > 0
    text = results.read_text()
    assert "before" in text and "after" in text and "old" not in text
    assert "| ratio of mean step time, 3 dashboard consumers (bundled, niced) / none |" in text
    assert "| 3 consumers, one message a step |" in text
