"""The packages import each other only as DESIGN.md's Layout table allows.

Every .py file of each package is parsed with `ast` and every import is collected: at
module level, inside functions, under `if TYPE_CHECKING:`, `from x import y` and relative
forms (resolved against the file's package), and `importlib.import_module("x")` /
`__import__("x")` with a literal name.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the project's top-level packages; tuning/ and stats/ are checked when they exist
PACKAGES = ("engine", "kernels", "storage", "api", "dashboard", "tuning", "stats")
PROJECT = frozenset((*PACKAGES, "benchmarks"))

# package -> project packages it must never import (DESIGN.md, Layout); benchmarks
# "must not be imported by the packages"
FORBIDDEN: dict[str, frozenset[str]] = {
    "engine": frozenset({"api", "storage", "dashboard", "tuning", "benchmarks"}),
    "kernels": PROJECT - {"kernels"},
    "storage": frozenset({"api", "dashboard", "tuning", "benchmarks"}),
    "api": frozenset({"benchmarks"}),
    "dashboard": frozenset({"engine", "storage", "kernels", "tuning", "benchmarks"}),
    "tuning": frozenset({"api", "storage", "dashboard", "benchmarks"}),
    "stats": PROJECT - {"stats"},
}
REQUIRED = ("engine", "kernels", "storage", "api", "dashboard")  # must exist and have files


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute dotted name
    text: str  # as written


def module_name(path: Path) -> str:
    """Dotted module name of a file relative to the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    up = node.level - 1
    if up > len(base) - 1:
        return "<beyond the top-level package>"
    base = base[: len(base) - up]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in `source`, the code of `module`, with absolute module names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            names = ", ".join(a.name for a in node.names)
            text = f"from {'.' * node.level}{node.module or ''} import {names}"
            found.append(Import(node.lineno, target, text))
            if node.module is None:  # `from . import x`: x may be a subpackage
                for alias in node.names:
                    found.append(Import(node.lineno, f"{target}.{alias.name}", text))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(Import(node.lineno, arg.value, f"{ast.unparse(node.func)}(...)"))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def violations(source: str, rel_path: str) -> list[str]:
    """`file:line: import` for each import that crosses the layering."""
    path = ROOT / rel_path
    package = Path(rel_path).parts[0]
    forbidden = FORBIDDEN[package]
    found = []
    for imp in imports_of(source, module_name(path), path.name == "__init__.py"):
        top = imp.module.split(".")[0]
        if top in forbidden:
            found.append(f"{rel_path}:{imp.line}: {imp.text} ({package} must not import {top})")
    return found


def package_files() -> dict[str, list[Path]]:
    return {
        pkg: sorted(p for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
        for pkg in PACKAGES
        if (ROOT / pkg).is_dir()
    }


def test_every_package_has_a_rule_and_the_main_ones_have_files() -> None:
    assert set(FORBIDDEN) == set(PACKAGES)
    files = package_files()
    for pkg in REQUIRED:
        assert files.get(pkg), f"{pkg}/ has no .py files: the layering test would check nothing"


def test_packages_import_only_what_the_layout_allows() -> None:
    found = []
    for files in package_files().values():
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            found += violations(path.read_text(encoding="utf-8"), rel)
    assert not found, "imports across the layering:\n" + "\n".join(found)


SYNTHETIC = """\
import os
from typing import TYPE_CHECKING
from engine.request import Request
from . import sampling
from .model import moe

if TYPE_CHECKING:
    from dashboard.app import main


def later():
    import storage.store
    from api import app
    return importlib.import_module("tuning.twin")
"""


def test_the_checker_catches_each_form_of_import() -> None:
    assert violations(SYNTHETIC, "engine/fake.py") == [
        "engine/fake.py:8: from dashboard.app import main (engine must not import dashboard)",
        "engine/fake.py:12: import storage.store (engine must not import storage)",
        "engine/fake.py:13: from api import app (engine must not import api)",
        "engine/fake.py:14: importlib.import_module(...) (engine must not import tuning)",
    ]


@pytest.mark.parametrize(
    ("source", "rel_path", "bad"),
    [
        (
            "import torch\nfrom kernels.backend import x\nfrom . import triton_env\n",
            "kernels/a.py",
            0,
        ),
        ("from engine.config import Knobs\n", "kernels/a.py", 1),
        ("from engine.config import Knobs\n", "api/a.py", 0),
        ("from engine import LLM\n", "dashboard/a.py", 1),
        ("import api.errors\n", "dashboard/a.py", 0),
        ("from engine.scheduler import Scheduler\nfrom stats import p\n", "tuning/a.py", 0),
        ("from storage.queries import q\n", "tuning/a.py", 1),
        ("import math\nfrom .percentiles import p\n", "stats/__init__.py", 0),
        ("from engine.telemetry import StepTelemetry\n", "stats/a.py", 1),
        ("from stats import percentile\n", "engine/a.py", 0),
        ("from results_md import table\nimport benchmarks.bench\n", "storage/a.py", 1),
        ("from ..api import x\n", "engine/ep/a.py", 0),  # engine.api, not the api package
    ],
)
def test_rules_per_package(source: str, rel_path: str, bad: int) -> None:
    assert len(violations(source, rel_path)) == bad


def test_relative_imports_resolve_against_the_package() -> None:
    got = imports_of("from . import a\nfrom ..b import c\nfrom .d import e\n", "engine.ep.x")
    assert [i.module for i in got] == ["engine.ep", "engine.ep.a", "engine.b", "engine.ep.d"]
    got = imports_of("from . import a\nfrom .d import e\n", "engine.ep", is_package=True)
    assert [i.module for i in got] == ["engine.ep", "engine.ep.a", "engine.ep.d"]
