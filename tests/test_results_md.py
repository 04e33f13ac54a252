"""benchmarks/results_md.py: each benchmark rewrites only its own section of RESULTS.md."""

from pathlib import Path

from results_md import write_section  # benchmarks/ is on pytest's pythonpath

BEGIN, END = "<!-- mine:begin -->", "<!-- mine:end -->"


def test_appends_then_replaces_only_its_section(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    other = "<!-- other:begin -->\nkept\n<!-- other:end -->"
    path.write_text(f"# Benchmark results\n\n{other}\n")
    write_section(path, f"{BEGIN}\nfirst\n{END}", BEGIN, END)
    assert path.read_text() == f"# Benchmark results\n\n{other}\n\n{BEGIN}\nfirst\n{END}\n"
    write_section(path, f"{BEGIN}\nsecond\n{END}", BEGIN, END)
    assert path.read_text() == f"# Benchmark results\n\n{other}\n\n{BEGIN}\nsecond\n{END}\n"


def test_creates_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    write_section(path, f"{BEGIN}\nonly\n{END}", BEGIN, END)
    assert path.read_text() == f"# Benchmark results\n\n{BEGIN}\nonly\n{END}\n"
