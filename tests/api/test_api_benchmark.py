"""Smoke test: the serving benchmark runs end to end on the tiny model."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serving_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_writes_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    bench = _load()
    section = bench.main(["--quick", "--results", str(results)])
    text = results.read_text()
    assert "kept" in text and section in text
    assert "| 4 | 6 (6) |" in section
    assert "Ratio of mean step time on / off" in section
    bench.write_section(results, section.replace("Online serving", "Online serving again"))
    text = results.read_text()
    assert text.count("<!-- serving:begin -->") == 1 and "serving again" in text
    assert "kept" in text
