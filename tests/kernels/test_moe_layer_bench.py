"""Smoke test: the CPU MoE-layer benchmark runs and rewrites only its own RESULTS.md section."""

from pathlib import Path

import pytest
import torch

from benchmarks.harness.results_md import markers
from benchmarks.speed import moe_layer as bench

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU benchmark")


def test_quick_run_times_every_implementation(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    other = "<!-- offline_throughput:begin -->\nkept\n<!-- offline_throughput:end -->"
    results.write_text(f"# Benchmark results\n\n{other}\n")
    out = bench.main(["--quick", "--results", str(results)])
    assert out["names"][0] == "moescope MoEBlock (grouped_mm)" and len(out["names"]) == 7
    assert "moescope MoEBlock (native grouped GEMM, the CPU's default)" in out["names"]
    assert "moescope MoEBlock (oneDNN)" in out["names"]
    assert "transformers MixtralSparseMoeBlock (eager)" in out["names"]
    assert list(out["ms"]) == [1, 8]
    assert all(set(ms) == set(out["names"]) for ms in out["ms"].values())
    assert all(t > 0 for ms in out["ms"].values() for t in ms.values())
    bench.main(["--quick", "--results", str(results)])
    text = results.read_text()
    assert other in text and all(text.count(m) == 1 for m in markers(bench.SECTION))
