"""Smoke test: the offline throughput benchmark runs end to end on a tiny model."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.harness.results_md import markers
from benchmarks.speed import offline_throughput as bench
from benchmarks.speed.offline_runners import QUICK_SHAPE, make_workload


@pytest.mark.slow
def test_quick_run_returns_every_run_and_target(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nkept\n")
    report = bench.main(["--quick", "--requests", "6", "--results", str(results)])
    wl = make_workload(6, 0, QUICK_SHAPE.vocab, (4, 32), (2, 16))
    runs = report["runs"]
    assert list(runs) == ["ours", "ours_static", "hf_static", "hf_cb"]
    for run in runs.values():  # every request, each with its own output length
        assert [len(t) for t in run.tokens] == wl.max_tokens
        assert len(run.ttft_s) == 6 and run.wall_s > 0 and run.tok_per_s > 0
    ours = runs["ours"]
    assert 0 < ours.extra["dur_s"]["forward"] <= ours.wall_s
    assert (
        ours.extra["split"]["prefill"][0] + ours.extra["split"]["decode"][0] == ours.extra["steps"]
    )
    assert set(report["targets"]) == set(bench.TARGETS)
    for key, check in report["targets"].items():
        assert check["value"] > 0 and check["met"] == bench.TARGETS[key].met(check["value"])
    begin, _ = markers(bench.SECTION)
    assert results.read_text().count(begin) == 1 and "kept" in results.read_text()

    again = bench.main(["--quick", "--requests", "3", "--skip-hf-cb", "--results", str(results)])
    assert "hf_cb" not in again["runs"] and "hf_cb" not in again["targets"]
    assert results.read_text().count(begin) == 1 and "kept" in results.read_text()


def test_workload_is_seeded_and_in_range() -> None:
    a = make_workload(64, 3, 1000, (16, 512), (8, 256))
    assert a == make_workload(64, 3, 1000, (16, 512), (8, 256))
    assert all(16 <= len(p) <= 512 for p in a.prompts)
    assert all(8 <= n <= 256 for n in a.max_tokens)
    assert all(0 < t < 1000 for p in a.prompts for t in p)
