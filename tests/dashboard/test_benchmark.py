"""Smoke test: benchmarks/dashboard/bench.py runs end to end in its quick mode."""

from pathlib import Path

import pytest

from benchmarks.dashboard import bench
from benchmarks.harness.results_md import markers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(bench.CHROMIUM).exists(), reason="no /usr/bin/chromium"),
]


def test_dashboard_benchmark_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    begin, end = markers(bench.SECTION)
    results.write_text(f"# Results\n\nbefore\n\n{begin}\nold\n{end}\n\nafter\n")
    res = bench.main(["--quick", "--results", str(results)])
    clicks = res["clicks"]
    assert len(clicks["to_server"]) == len(clicks["to_marker"]) == 2
    pairs = list(zip(clicks["to_server"], clicks["to_marker"], strict=True))
    assert all(0 < s < m for s, m in pairs), pairs
    assert set(res["switches"]) == {
        "Live -> Compare",
        "Compare -> Live",
        "Live -> Replay",
        "Play -> replay's first chart",
    }
    frame, plotly, socket, seen = parts = res["switch_parts"]
    assert 0 < frame < min(plotly, socket) and max(plotly, socket) <= seen, parts
    assert res["rates"] and all(hz > 0 for hz, _ in res["rates"].values()), res["rates"]
    assert set(res["cpu_pct"]) == {0, 1}  # --quick opens one page at most
    overhead = res["overhead"]
    assert all(ms > 0 for ms in overhead["mean_ms"].values()), overhead
    assert overhead["round_median"]["none"] == overhead["cpu_ratio"]["none"] == 1.0
    assert overhead["traffic"]["frames"] > 0 and overhead["traffic"]["answers"] >= 2
    adjusted = overhead["adjusted"]
    assert all(r > 0 for rs in adjusted["blocks"].values() for r in rs), adjusted
    assert overhead["adjusted_ratio"]["none"] == 1.0 and adjusted["steps"] >= 40
    assert set(res["targets"]) == set(bench.TARGETS)
    for key, check in res["targets"].items():
        assert check["met"] == bench.TARGETS[key].met(check["value"])
    text = results.read_text()
    assert "before" in text and "after" in text and "old" not in text
    assert "click Apply -> marker on the first chart" in text
