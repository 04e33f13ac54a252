"""Smoke test: the offline throughput benchmark runs end to end on a tiny model."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import offline_throughput as bench  # (benchmarks/ is on pytest's pythonpath)


@pytest.mark.slow
def test_quick_run_prints_and_writes_the_table(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nkept\n")
    section = bench.main(["--quick", "--requests", "6", "--results", str(results)])
    for row in (
        "| moescope continuous |",
        "| moescope static |",
        "| transformers generate (static) |",
        "| transformers continuous batching |",
    ):
        assert row in section
    assert "Forward-only bound" in section
    assert section.count("- [") == 4  # one line per target, met or missed
    text = results.read_text()
    assert "kept" in text and section in text
    bench.main(["--quick", "--requests", "3", "--skip-hf-cb", "--results", str(results)])
    rewritten = results.read_text()
    assert rewritten.count(bench.BEGIN) == 1 and "kept" in rewritten
    assert "| transformers continuous batching |" not in rewritten


def test_workload_is_seeded_and_in_range() -> None:
    a = bench.make_workload(64, 3, 1000, (16, 512), (8, 256))
    assert a == bench.make_workload(64, 3, 1000, (16, 512), (8, 256))
    assert all(16 <= len(p) <= 512 for p in a.prompts)
    assert all(8 <= n <= 256 for n in a.max_tokens)
    assert all(0 < t < 1000 for p in a.prompts for t in p)
