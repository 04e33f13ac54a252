"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other sections alone."""

from pathlib import Path


def write_section(path: Path, section: str, begin: str, end: str) -> None:
    """Replace the text from `begin` to `end` with `section` (which holds both), or append it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
