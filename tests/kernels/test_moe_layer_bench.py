"""Smoke test: the CPU MoE-layer benchmark runs and rewrites only its own RESULTS.md section."""

from pathlib import Path

import moe_layer as bench  # benchmarks/ is on pytest's pythonpath
import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU benchmark")


def test_quick_run_writes_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    other = "<!-- offline_throughput:begin -->\nkept\n<!-- offline_throughput:end -->"
    results.write_text(f"# Benchmark results\n\n{other}\n")
    section = bench.main(["--quick", "--results", str(results)])
    for name in (
        "moescope MoEBlock (grouped_mm)",
        "transformers MixtralSparseMoeBlock (eager)",
        "per-token loop",
    ):
        assert f"| {name} |" in section
    assert "| 1 tokens | 8 tokens |" in section
    bench.main(["--quick", "--results", str(results)])
    text = results.read_text()
    assert other in text and text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1
