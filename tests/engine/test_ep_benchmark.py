"""Smoke test: the expert-parallel benchmark runs end to end on the tiny model with 2 ranks."""

from pathlib import Path

import expert_parallel as bench  # benchmarks/ is on pytest's pythonpath
import pytest


@pytest.mark.slow
def test_quick_run_writes_the_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nkept\n")
    section = bench.main(["--quick", "--results", str(results)])
    rows = [line for line in section.splitlines() if line.startswith("| 1 process")
            or line.startswith("| 2 ranks")]
    assert len(rows) == 4
    imbalance = [float(row.split("|")[6]) for row in rows]
    assert imbalance[0] == 1.0 and imbalance[2] < imbalance[1]
    text = results.read_text()
    assert "kept" in text and section in text
