"""Smoke test: benchmarks/dashboard.py runs end to end in its quick mode."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks" / "dashboard.py"


def test_dashboard_benchmark_quick(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_dashboard", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = tmp_path / "RESULTS.md"
    results.write_text(f"# Results\n\nbefore\n\n{bench.BEGIN}\nold\n{bench.END}\n\nafter\n")
    res = bench.main(["--quick", "--results", str(results)])
    assert res["lag"]["samples"] > 0 and res["lag"]["steps_per_s"] > 0
    assert res["render"]["frames"] > 0 and res["render"]["build_ms"] > 0
    assert res["overhead"]["off_ms"] > 0 and res["overhead"]["on_ms"] > 0
    text = results.read_text()
    assert "before" in text and "after" in text and "old" not in text
    assert "| ratio 3 consumers / none |" in text
