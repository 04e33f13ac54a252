"""Smoke test: the serving benchmark runs end to end on the tiny model."""

from pathlib import Path

import pytest
import serving as bench  # benchmarks/ is on pytest's pythonpath


@pytest.mark.slow
def test_quick_run_writes_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    section = bench.main(["--quick", "--results", str(results)])
    text = results.read_text()
    assert "kept" in text and section in text
    assert "| 4 | 6 (6) |" in section
    assert "Ratio of mean step time on / off" in section
    bench.write_section(
        results, section.replace("Online serving", "Online serving again"), bench.BEGIN, bench.END
    )
    text = results.read_text()
    assert text.count("<!-- serving:begin -->") == 1 and "serving again" in text
    assert "kept" in text
