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


def publish(
    section: str, results: Path | None, quick: bool, default: Path, begin: str, end: str
) -> str:
    """Print the section and write it to `results`, else to `default` unless a --quick run."""
    print(section)
    path = results or (None if quick else default)
    if path is not None:
        write_section(path, section, begin, end)
    return section
