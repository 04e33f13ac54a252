"""Smoke test: benchmarks/dashboard_bench.py runs end to end in its quick mode."""

from pathlib import Path

import dashboard_bench as bench  # benchmarks/ is on pytest's pythonpath
import pytest
from results_md import markers

pytestmark = pytest.mark.slow


def test_dashboard_benchmark_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    begin, end = markers(bench.SECTION)
    results.write_text(f"# Results\n\nbefore\n\n{begin}\nold\n{end}\n\nafter\n")
    res = bench.main(["--quick", "--results", str(results)])
    assert res["lag"]["samples"] > 0 and res["lag"]["steps_per_s"] > 0
    assert res["render"]["frames"] > 0 and res["render"]["build_ms"] > 0
    for mode in bench.MODES:
        assert res["overhead"][mode]["wall"] > 0 and res["overhead"][mode]["cpu"] > 0
        assert res["overhead"][mode]["server"] >= 0
    assert res["overhead"][bench.DASHBOARD]["consumer"] > 0
    assert set(res["targets"]) == set(bench.TARGETS)
    for key, check in res["targets"].items():
        assert check["met"] == bench.TARGETS[key].met(check["value"])
    assert res["targets"]["overhead"]["value"] == res["overhead"][bench.DASHBOARD]["ratio"]
    text = results.read_text()
    assert "before" in text and "after" in text and "old" not in text
