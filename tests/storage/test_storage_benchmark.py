"""Smoke test: the recorder benchmark runs end to end on the tiny model and keeps other sections."""

from pathlib import Path

from benchmarks.harness.results_md import markers
from benchmarks.speed import recorder as bench


def test_quick_run_records_every_step(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    out = bench.main(["--quick", "--results", str(results), "--db-dir", str(tmp_path)])
    tp, oh = out["throughput"], out["overhead"]
    assert tp["steps"] == 300 and tp["dropped"] == 0 and tp["steps_per_s"] > 0
    assert out["db_bytes_per_step"] > 0
    assert oh["written"] == oh["groups"] * oh["block"] == 3 * 2  # every "on" step, once
    assert set(oh["mean_ms"]) == set(bench.MODES) and min(oh["mean_ms"].values()) > 0
    target = out["targets"]["overhead"]
    assert target["value"] == oh["ratio"] and target["met"] == (oh["ratio"] <= 1.02)
    bench.main(["--quick", "--results", str(results), "--db-dir", str(tmp_path)])
    text = results.read_text()
    assert all(text.count(m) == 1 for m in markers(bench.SECTION)) and "kept" in text
    record = bench.synth_record(3, 1.0, running=64, layers=8, experts=64)
    assert len(record["batch"]["slots"]) == 64 and len(record["experts"]["counts"]) == 8
    assert all(len(row) == 64 for row in record["experts"]["counts"])
