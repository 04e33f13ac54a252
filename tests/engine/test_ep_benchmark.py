"""Smoke test: the expert-parallel benchmark runs end to end on the tiny model with 2 ranks."""

from pathlib import Path

import pytest

from benchmarks.harness.results_md import markers
from benchmarks.speed import expert_parallel as bench


@pytest.mark.slow
def test_quick_run_rebalances_and_moves_bytes(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nkept\n")
    runs = bench.main(["--quick", "--results", str(results)])["runs"]
    assert [r.name for r in runs] == [
        "1 process",
        "2 ranks, contiguous",
        "2 ranks, rebalanced",
        "2 ranks, rebalanced + 2 replicas",
    ]
    assert runs[0].imbalance == 1.0 and runs[2].imbalance < runs[1].imbalance
    assert runs[0].bytes_per_token == runs[0].gather_per_token == 0
    assert min(r.bytes_per_token for r in runs[1:]) > 0
    assert min(r.gather_per_token for r in runs[1:]) > 0
    assert all(len(r.rank_tokens) == 2 for r in runs[1:])
    text = results.read_text()
    assert "kept" in text and text.count(markers(bench.SECTION)[0]) == 1
