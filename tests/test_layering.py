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

# the project's top-level packages
PACKAGES = (
    "engine",
    "kernels",
    "storage",
    "api",
    "server",
    "cli",
    "dashboard",
    "tuning",
    "stats",
    "models",
    "fleet",
)
PROJECT = frozenset((*PACKAGES, "benchmarks"))

# package -> project packages it must never import (DESIGN.md, Layout); benchmarks
# "must not be imported by the packages"
FORBIDDEN: dict[str, frozenset[str]] = {
    "engine": frozenset(
        {"api", "server", "cli", "storage", "dashboard", "tuning", "fleet", "benchmarks"}
    ),
    "kernels": PROJECT - {"kernels"},
    "storage": frozenset({"api", "server", "cli", "dashboard", "tuning", "fleet", "benchmarks"}),
    "api": frozenset({"cli", "dashboard", "fleet", "benchmarks"}),  # routes use services
    "server": frozenset({"api", "cli", "dashboard", "fleet", "benchmarks"}),  # never the routes
    "cli": frozenset({"benchmarks"}),  # and of api only ROUTE_FREE
    "dashboard": frozenset(
        {"engine", "storage", "kernels", "tuning", "server", "cli", "fleet", "benchmarks"}
    ),
    "tuning": frozenset({"api", "server", "cli", "storage", "dashboard", "fleet", "benchmarks"}),
    "stats": PROJECT - {"stats"},
    "models": PROJECT - {"models"},  # the demo's training script: transformers only
    # the Ray Serve app: replicas run the app (api.app), the ingress talks to them over HTTP
    "fleet": frozenset({"cli", "dashboard", "benchmarks"}),  # and of api only ROUTE_FREE
}
# the api modules the command line and the fleet may import: they start the app (the fleet
# answers in its error shape), and hold no route
ROUTE_FREE = frozenset({"api", "api.app", "api.launch", "api.errors"})
# subpackage -> sibling subpackages it must never import: the twin knows no decisions
FORBIDDEN_SUBPACKAGES: dict[str, frozenset[str]] = {
    "tuning.twin": frozenset({"tuning.autopilot", "tuning.attribution"}),
    "tuning.attribution": frozenset({"tuning.autopilot", "tuning.twin"}),
}
REQUIRED = PACKAGES  # must exist and have files


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
    module = module_name(path)
    for imp in imports_of(source, module, path.name == "__init__.py"):
        top = imp.module.split(".")[0]
        if top in forbidden:
            found.append(f"{rel_path}:{imp.line}: {imp.text} ({package} must not import {top})")
        elif package in ("cli", "fleet") and top == "api" and imp.module not in ROUTE_FREE:
            found.append(f"{rel_path}:{imp.line}: {imp.text} ({package} must not import routes)")
        for sub, banned in FORBIDDEN_SUBPACKAGES.items():
            hit = next((b for b in banned if _within(imp.module, b)), None)
            if _within(module, sub) and hit:
                found.append(f"{rel_path}:{imp.line}: {imp.text} ({sub} must not import {hit})")
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def package_files(packages: tuple[str, ...] = PACKAGES) -> dict[str, list[Path]]:
    return {
        pkg: sorted(p for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
        for pkg in packages
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


def test_no_two_modules_import_each_other() -> None:
    """An import circle between two files means neither is the owner: one of them should hold
    what both need, or the pair should be one file."""
    files = [p for fs in package_files((*PACKAGES, "benchmarks")).values() for p in fs]
    names = {module_name(p): p for p in files}
    imported: dict[str, set[str]] = {}
    for name, path in names.items():
        found = imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        imported[name] = {i.module for i in found if i.module in names and i.module != name}
    circles = sorted(
        f"{a} <-> {b}" for a, deps in imported.items() for b in deps if a < b and a in imported[b]
    )
    assert not circles, "modules that import each other:\n" + "\n".join(circles)


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
        ("from server.live_window import LiveWindow\n", "api/a.py", 0),
        ("from api.errors import APIError\n", "server/a.py", 1),
        ("from api.app import create_app\nfrom server.settings import S\n", "cli/a.py", 0),
        ("from api.control import router\n", "cli/a.py", 1),
        ("from api.app import create_app\nfrom engine import LLM\n", "fleet/a.py", 0),
        ("from api.openai_routes import router\n", "fleet/a.py", 1),
        ("from fleet.app import start\n", "cli/a.py", 0),
        ("from fleet.routing import STATE\n", "dashboard/a.py", 1),
        ("from tuning.twin.outcome import outcome\n", "tuning/autopilot/a.py", 0),
        ("from tuning.autopilot.settings import S\n", "tuning/twin/a.py", 1),
    ],
)
def test_rules_per_package(source: str, rel_path: str, bad: int) -> None:
    assert len(violations(source, rel_path)) == bad


def test_relative_imports_resolve_against_the_package() -> None:
    got = imports_of("from . import a\nfrom ..b import c\nfrom .d import e\n", "engine.ep.x")
    assert [i.module for i in got] == ["engine.ep", "engine.ep.a", "engine.b", "engine.ep.d"]
    got = imports_of("from . import a\nfrom .d import e\n", "engine.ep", is_package=True)
    assert [i.module for i in got] == ["engine.ep", "engine.ep.a", "engine.ep.d"]
