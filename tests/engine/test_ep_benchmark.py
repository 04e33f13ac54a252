"""Smoke test: the expert-parallel benchmark runs end to end on the tiny model with 2 ranks."""

from pathlib import Path

import expert_parallel as bench  # benchmarks/ is on pytest's pythonpath
import pytest


@pytest.mark.slow
def test_quick_run_writes_the_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nkept\n")
    section = bench.main(["--quick", "--results", str(results)])
    rows = [
        line
        for line in section.splitlines()
        if line.startswith("| 1 process") or line.startswith("| 2 ranks")
    ]
    assert len(rows) == 4
    cells = [[cell.strip().replace(",", "") for cell in row.split("|")] for row in rows]
    a2a, gather, imbalance = ([float(c[i]) for c in cells] for i in (5, 6, 7))
    assert imbalance[0] == 1.0 and imbalance[2] < imbalance[1]
    assert a2a[0] == gather[0] == 0 and min(a2a[1:]) > 0 and min(gather[1:]) > 0
    text = results.read_text()
    assert "kept" in text and section in text
