"""benchmarks/harness/results_md.py: each benchmark rewrites only its own section of
RESULTS.md."""

import argparse
from pathlib import Path

import pytest

from benchmarks.harness.machine import measure
from benchmarks.harness.results_md import (
    RESULTS_PATH,
    add_results_arguments,
    header,
    publish,
    results_path,
)

BEGIN, END = "<!-- mine:begin -->", "<!-- mine:end -->"


def test_appends_then_replaces_only_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "RESULTS.md"
    other = "<!-- other:begin -->\nkept\n<!-- other:end -->"
    path.write_text(f"# Benchmark results\n\n{other}\n\nnotes\n")
    assert publish("mine", "first\n", path) == f"{BEGIN}\nfirst\n{END}"
    assert path.read_text() == f"# Benchmark results\n\n{other}\n\nnotes\n\n{BEGIN}\nfirst\n{END}\n"
    publish("mine", "second", path)
    assert (
        path.read_text() == f"# Benchmark results\n\n{other}\n\nnotes\n\n{BEGIN}\nsecond\n{END}\n"
    )
    assert f"{BEGIN}\nsecond\n{END}" in capsys.readouterr().out


def test_creates_a_missing_file_and_writes_nothing_without_a_path(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    publish("mine", "only", path)
    assert path.read_text() == f"# Benchmark results\n\n{BEGIN}\nonly\n{END}\n"
    publish("mine", "not written", None)
    assert "not written" not in path.read_text()


def test_results_path_of_the_shared_arguments(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_results_arguments(p)
    assert results_path(p.parse_args([])) == RESULTS_PATH
    assert Path(__file__).resolve().parents[1] / "benchmarks" / "RESULTS.md" == RESULTS_PATH
    assert RESULTS_PATH.is_file()
    assert results_path(p.parse_args(["--quick"])) is None
    assert results_path(p.parse_args(["--quick", "--results", str(tmp_path)])) == tmp_path
    assert results_path(p.parse_args(["--results", str(tmp_path), "--no-write"])) is None


def test_header_measures_the_machine() -> None:
    m = measure()
    assert m["cores"] >= 1 and m["cpu_count"] >= m["cores"] and m["torch_threads"] >= 1
    assert len(m["load_avg"]) == 3 and m["cpu"]
    text = header("Title", ["python", "b.py", "--x", "a b"], 150.0, m).splitlines()
    assert text[0] == "## Title" and text[2] == "- Command: `python b.py --x 'a b'`"
    assert text[3] == f"- Date: {m['date']}; total runtime 2.5 min"
    assert f"{m['cores']} cores usable (of {m['cpu_count']})" in text[4]
