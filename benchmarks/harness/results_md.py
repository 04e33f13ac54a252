"""Each benchmark's section of benchmarks/RESULTS.md: its header, and writing it in place."""

import argparse
import shlex
from pathlib import Path
from typing import Any

from benchmarks.harness.machine import describe
from stats import QUANTILES

RESULTS_PATH = Path(__file__).resolve().parents[1] / "RESULTS.md"  # benchmarks/RESULTS.md


def header(title: str, command: list[str], runtime_s: float | None, machine: dict[str, Any]) -> str:
    """The lines every section starts with: title, command (its words), date and runtime, and
    the machine (`machine.measure()` in the process that measured)."""
    runtime = "" if runtime_s is None else f"; total runtime {_duration(runtime_s)}"
    return "\n".join(
        [
            f"## {title}",
            "",
            f"- Command: `{shlex.join(command)}`",
            f"- Date: {machine['date']}{runtime}",
            f"- Machine: {describe(machine)}",
        ]
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def percentiles_cell(s: dict[str, float | None], digits: int) -> str:
    """`p50 / p90 / p99` of a `stats.summary`, as one table cell (`-` where there is none)."""
    return " / ".join("-" if (v := s[f"p{q}"]) is None else f"{v:.{digits}f}" for q in QUANTILES)


def add_results_arguments(p: argparse.ArgumentParser) -> None:
    """--results and --no-write, the same in every benchmark (see `results_path`)."""
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="RESULTS.md to update (default benchmarks/RESULTS.md; --quick writes nothing "
        "unless given)",
    )
    p.add_argument("--no-write", action="store_true", help="leave every RESULTS.md alone")


def results_path(args: argparse.Namespace) -> Path | None:
    """Where the section goes: --results, else RESULTS.md unless --quick; None: nowhere."""
    if args.no_write:
        return None
    return args.results or (None if args.quick else RESULTS_PATH)


def markers(name: str) -> tuple[str, str]:
    """The comments around section `name` in RESULTS.md."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def publish(name: str, text: str, path: Path | None) -> str:
    """Wrap `text` in section `name`'s markers, print it, and write it into `path` (in place of
    that section, else at the end; a missing file is created) unless `path` is None. Other
    sections and text outside the markers stay as they are. Returns the section."""
    begin, end = markers(name)
    section = f"{begin}\n{text.rstrip()}\n{end}"
    print(section)
    if path is None:
        return section
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + section + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(new)
    print(f"wrote {path}", flush=True)
    return section
