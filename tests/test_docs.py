"""The prose documents: short, valid as shown, and generated parts in step with the code."""

import ast
import re
from pathlib import Path

import pytest

from docs import make_reference as reference

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
REFERENCE = ROOT / "docs" / "reference.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PROSE = [README, ARCHITECTURE, REFERENCE]
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def code_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of every fenced block in `path`."""
    blocks: list[tuple[str, int, str]] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match and lang is None:
            lang, start, body = match.group(2) or "text", number, []
        elif match and lang is not None:
            blocks.append((lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{path.name}: the block opened at line {start} is never closed"
    return blocks


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of `path` outside fenced blocks."""
    out, inside = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


def test_readme_is_short_and_opens_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    lang, _, first = code_blocks(README)[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert commands[:2] == ["make demo", "make test"], first
    before = "\n".join(lines[: lines.index("```sh")])
    assert before.strip() == "# moescope", "nothing but the title may come before the commands"


def test_architecture_is_short() -> None:
    count = len(ARCHITECTURE.read_text().splitlines())
    assert count <= 300, f"docs/ARCHITECTURE.md has {count} lines (at most 300)"


def test_readme_python_blocks_parse() -> None:
    blocks = [(start, text) for lang, start, text in code_blocks(README) if lang == "python"]
    assert blocks, "README.md shows no Python"
    for start, text in blocks:
        try:
            ast.parse(text)
        except SyntaxError as exc:
            pytest.fail(f"README.md: the python block at line {start} does not parse: {exc}")


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.name)
def test_inline_code_spans_stay_on_one_line(path: Path) -> None:
    broken = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in prose_lines(path)
        if line.count("`") % 2
    ]
    assert not broken, "an inline code span breaks across lines:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.name)
def test_local_links_resolve(path: Path) -> None:
    missing = [
        target
        for _, line in prose_lines(path)
        for target in LINK.findall(line)
        if "://" not in target and not (path.parent / target).exists()
    ]
    assert not missing, f"{path.name} links to files that do not exist: {missing}"


def test_dashboard_picture_is_small() -> None:
    picture = ROOT / "docs" / "dashboard.png"
    if picture.exists():
        assert picture.stat().st_size < 300_000


def test_results_readings_are_short() -> None:
    """Between the generated sections of RESULTS.md, a hand-written reading of at most 10
    lines each (the history of a number lives in git)."""
    text = RESULTS.read_text()
    pieces = re.split(r"<!-- (\S+):begin -->.*?<!-- \1:end -->", text, flags=re.S)
    names = ["(top)", *pieces[1::2]]
    long = [
        f"after {name}: {count} lines"
        for name, piece in zip(names, pieces[::2], strict=True)
        if (count := sum(1 for line in piece.splitlines() if line.strip())) > 10
    ]
    assert not long, f"benchmarks/RESULTS.md readings over 10 lines: {long}"
    for name in pieces[1::2]:
        section = text.split(f"<!-- {name}:begin -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
        assert "Machine" in section or "Measured" in section, f"section {name} names no machine"


def test_reference_generated_sections_match_the_code() -> None:
    text = REFERENCE.read_text()
    stale = reference.stale_sections(text)
    assert not stale, (
        f"docs/reference.md is out of date in {stale}: run `python -m docs.make_reference` "
        "and commit the result"
    )


def test_reference_render_only_touches_generated_sections() -> None:
    text = "intro\n<!-- knobs:begin -->\nold\n<!-- knobs:end -->\nafter\n"
    out = reference.render(text, {"knobs": "| new |"})
    assert out == "intro\n<!-- knobs:begin -->\n| new |\n<!-- knobs:end -->\nafter\n"
    with pytest.raises(ValueError, match="cli:begin"):
        reference.render(text, {"cli": "x"})


def test_every_route_has_a_summary() -> None:
    missing = [f"{r['method']} {r['path']}" for r in reference.route_rows() if not r["summary"]]
    assert not missing, f"give these handlers a docstring: {missing}"
