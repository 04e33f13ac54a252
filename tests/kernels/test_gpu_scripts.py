"""benchmarks/gpu/run_all.sh runs end to end in its CPU dry-run mode (so it doesn't rot)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, run_all.sh runs for real")
def test_dry_run_makes_the_table(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "OUT": str(tmp_path)}
    run = subprocess.run(
        ["bash", "benchmarks/gpu/run_all.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "!! failed" not in run.stdout
    text = (tmp_path / "gpu_results.md").read_text()
    assert text.count("| mixtral (E8") == 2 and text.count("| fine-grained (E16") == 2
    assert "faster than grouped_mm" in text
    assert "| triton | synthetic:tiny |" in text and "| torch | synthetic:tiny |" in text
    assert {p.name for p in tmp_path.iterdir()} == {
        "bench.log",
        "roofline.json",
        "moe.json",
        "engine.json",
        "gpu_results.md",
    }


def test_report_rewrites_only_its_results_section(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    import report

    results = tmp_path / "RESULTS.md"
    other = "<!-- moe_layer:begin -->\nkept\n<!-- moe_layer:end -->"
    results.write_text(f"# Benchmark results\n\n{other}\n")
    report.write_results(results, "first table\n")
    report.write_results(results, "second table\n")
    text = results.read_text()
    assert other in text and "second table" in text and "first table" not in text
    assert text.count(report.BEGIN) == 1
