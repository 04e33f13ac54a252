"""benchmarks/gpu/: run_all.sh runs end to end in its CPU dry-run mode (so it doesn't rot), and
the report checks the targets and rewrites only its RESULTS.md section."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import report
from benchmarks.harness.machine import measure

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, run_all.sh runs for real")
def test_dry_run_measures_every_shape_and_backend(tmp_path: Path) -> None:
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
    assert re.search(r"decode-only steps: schedule .* over [1-9]\d* steps", run.stdout)
    assert {p.name for p in tmp_path.iterdir()} == {
        "bench.log",
        "roofline.json",
        "moe.json",
        "engine.json",
        "gpu_results.md",
    }
    roof, rows, runs = (json.loads((tmp_path / f).read_text()) for f in REPORT_FILES)
    assert roof["machine"]["cores"] >= 1 and roof["copy_gbps"] > 0
    assert [(r["name"], r["experts"], r["phase"]) for r in rows] == [
        ("mixtral", 8, "decode"),
        ("mixtral", 8, "prefill"),
        ("fine-grained", 16, "decode"),
        ("fine-grained", 16, "prefill"),
    ]
    assert all(r["ms"]["ours"] > 0 and r["rel_err"] < 0.05 for r in rows)
    assert [(r["backend"], r["overlap"], r["model"]) for r in runs] == [
        ("triton", False, "synthetic:tiny"),
        ("torch", False, "synthetic:tiny"),
        ("torch", True, "synthetic:tiny"),
    ]
    for r in runs:  # 3 tokens for each of 3 requests; one forward pass at a time, in the wall
        assert r["output_tokens"] == 9 and 0 < r["forward_s"] <= r["wall_s"]
        assert r["forward_share"] == pytest.approx(r["forward_s"] / r["wall_s"])
        assert r["decode_steps"] > 0 and r["decode_host_ms"] > 0
        hidden = r["decode_hidden_ms"]
        # host work runs beside a forward pass only with overlap, and at most all of it
        assert 0 <= hidden <= r["decode_host_ms"] if r["overlap"] else hidden == 0
    table = (tmp_path / "gpu_results.md").read_text()
    assert "| overlap |" in table and "| forward / wall |" in table and "| hidden ms |" in table
    assert re.search(r"\| torch \| on \| synthetic:tiny \|.*\| (met|MISSED) \| MISSED \(", table)
    checks = report.main(_args(tmp_path))["targets"]
    targets = ["prefill", "decode", "prefill", "decode", "fine_grained"]
    assert [c["target"] for c in checks] == targets


REPORT_FILES = ("roofline.json", "moe.json", "engine.json")


def _args(folder: Path, *more: str) -> list[str]:
    files = [folder / f for f in REPORT_FILES]
    return ["--roofline", str(files[0]), "--moe", str(files[1]), "--engine", str(files[2]), *more]


def _row(name: str, phase: str, ms: float, grouped_mm: float, flop: float, nbytes: float) -> dict:
    """A moe.json row: 16 tokens of a small shape, with its times and work."""
    shape = {"experts": 8, "top_k": 2, "hidden": 64, "inter": 128, "tokens": 16, "active": 8}
    times = {"ours": ms, "grouped_mm": grouped_mm, "loop": 2 * ms}
    work = {"flop": flop, "weight_bytes": nbytes, "rel_err": 0.0}
    return {"name": name, "phase": phase, "ms": times, **shape, **work}


def test_report_checks_the_targets_and_rewrites_only_its_section(tmp_path: Path) -> None:
    roof = {"device": "test", "copy_gbps": 1000.0, "matmul_tflops": 100.0, "machine": measure()}
    rows = [  # 70 TFLOP/s of 100; 500 GB/s of 1000; 1.25x and 0.8x grouped_mm
        _row("mixtral", "prefill", 1.0, 1.0, 7e10, 0),
        _row("mixtral", "decode", 1.0, 1.0, 0, 5e8),
        _row("fine-grained", "prefill", 1.0, 1.25, 7e10, 0),
        _row("fine-grained", "decode", 1.0, 0.8, 0, 7e8),
    ]
    for name, data in zip(REPORT_FILES, (roof, rows, []), strict=True):
        (tmp_path / name).write_text(json.dumps(data))
    results = tmp_path / "RESULTS.md"
    other = "<!-- moe_layer:begin -->\nkept\n<!-- moe_layer:end -->"
    results.write_text(f"# Benchmark results\n\n{other}\n")
    for _ in range(2):
        checks = report.main(_args(tmp_path, "--results", str(results)))["targets"]
    assert [(c["subject"], c["met"]) for c in checks] == [
        ("mixtral prefill 16 tokens", True),
        ("mixtral decode 16 tokens", False),
        ("fine-grained prefill 16 tokens", True),
        ("fine-grained decode 16 tokens", True),
        ("every fine-grained row", False),
    ]
    assert [c["value"] for c in checks] == pytest.approx([0.7, 0.5, 0.7, 0.7, 0.8])
    text = results.read_text()
    assert other in text and text.count(f"<!-- {report.SECTION}:begin -->") == 1
