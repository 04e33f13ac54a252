"""Smoke test: the recorder benchmark runs end to end on the tiny model and keeps other sections."""

from pathlib import Path

import recorder as bench  # benchmarks/ is on pytest's pythonpath


def test_quick_run_writes_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    section = bench.main(["--quick", "--results", str(results), "--db-dir", str(tmp_path)])
    assert "| 300 |" in section and "Ratio of mean step time on / off" in section
    bench.main(["--quick", "--results", str(results), "--db-dir", str(tmp_path)])
    text = results.read_text()
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1 and "kept" in text
    record = bench.synth_record(3, 1.0, running=64, layers=8, experts=64)
    assert len(record["batch"]["slots"]) == 64 and len(record["experts"]["counts"]) == 8
    assert all(len(row) == 64 for row in record["experts"]["counts"])
