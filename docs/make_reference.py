"""The generated parts of docs/reference.md, written from the code itself.

Each section is a plain function returning markdown (`SECTIONS`): `SamplingParams`, the live
knobs (`engine.knobs.Knobs`), `StepTelemetry`'s fields, the autopilot's settings, the command
line (`cli.main.build_parser`), the HTTP and websocket routes (every `router = APIRouter()`
in `api/`) and the error types (`api.errors.ERROR_TYPES`). In docs/reference.md each sits
between `<!-- NAME:begin -->` and `<!-- NAME:end -->`; the text around the markers is
hand-written and left alone.

    python -m docs.make_reference           # rewrite the generated sections of docs/reference.md
    python -m docs.make_reference --check   # exit 1, naming them, if any section is out of date
"""

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import math
import os
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

REFERENCE_PATH = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def cell(text: object) -> str:
    """`text` as one markdown table cell: on one line, pipes escaped, and `<` too outside code
    spans (so that `synthetic:<preset>` is not taken for an HTML tag)."""
    pieces = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "\\<") for i, p in enumerate(pieces))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _number(value: float) -> str:
    """2048; 2^20, 2^64-1 and -2^63 for large powers of two; 0.01; 64.0 as 64."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and abs(value) >= 1 << 16:
        for near, suffix in ((abs(value), ""), (abs(value) + 1, "-1")):
            if near & (near - 1) == 0:
                return f"{'-' if value < 0 else ''}2^{near.bit_length() - 1}{suffix}"
    return str(value)


def _code(value: object) -> str:
    return "null" if value is None else f"`{json.dumps(value)}`"


# -- pydantic models: knobs, sampling parameters, autopilot settings -----------------------


def _json_type(option: dict[str, Any]) -> str:
    if "enum" in option or "const" in option:
        return "string"
    if "$ref" in option:
        return f"`{option['$ref'].rsplit('/', 1)[-1]}`"
    kind = option.get("type", "any")
    if kind == "object" and "additionalProperties" in option:
        return f"object of {_json_type(option['additionalProperties'])}"
    if kind == "array" and "items" in option:
        return f"array of {_json_type(option['items'])}"
    return str(kind)


def _allowed(option: dict[str, Any]) -> str:
    """`[1, 4096]`, `(0, 64]`, `≥ 1`, `> 0` or the enum's values."""
    if "enum" in option:
        return " \\| ".join(f"`{v}`" for v in option["enum"])
    low = option.get("minimum", option.get("exclusiveMinimum"))
    high = option.get("maximum", option.get("exclusiveMaximum"))
    open_low, open_high = "exclusiveMinimum" in option, "exclusiveMaximum" in option
    if low is not None and high is not None:
        left, right = "(" if open_low else "[", ")" if open_high else "]"
        return f"{left}{_number(low)}, {_number(high)}{right}"
    if low is not None:
        return f"{'>' if open_low else '≥'} {_number(low)}"
    if high is not None:
        return f"{'<' if open_high else '≤'} {_number(high)}"
    return ""


def model_rows(model: type[BaseModel], upper: dict[str, str] | None = None) -> list[list[str]]:
    """A row per field of a pydantic `model`: name, JSON type, default, allowed, description.
    `upper` names the upper bound of fields whose bound is only known at run time."""
    props = model.model_json_schema()["properties"]
    defaults = model().model_dump(mode="json")
    rows = []
    for name, prop in props.items():
        options = prop.get("anyOf", [prop])
        kept = [o for o in options if o.get("type") != "null"]
        nullable = len(kept) < len(options)
        kinds = " \\| ".join(dict.fromkeys(_json_type(o) for o in kept))
        allowed = " or ".join(filter(None, (_allowed(o) for o in kept)))
        if upper and name in upper:
            allowed = f"{allowed}, ≤ {upper[name]}"
        if nullable:
            kinds += " \\| null"
            allowed = f"{allowed} or null" if allowed else ""
        description = prop.get("description") or ""
        rows.append([f"`{name}`", kinds, _code(defaults[name]), allowed, cell(description)])
    return rows


def model_markdown(model: type[BaseModel], upper: dict[str, str] | None = None) -> str:
    return table(["field", "type", "default", "allowed", "description"], model_rows(model, upper))


def knobs_markdown() -> str:
    """The live knobs: one row per field of `engine.knobs.Knobs`."""
    from engine.knobs import Knobs

    return model_markdown(Knobs, {"kv_capacity_blocks": "blocks allocated"})


def sampling_markdown() -> str:
    """`engine.SamplingParams`, field by field."""
    from engine.sampling_params import SamplingParams

    return model_markdown(SamplingParams)


def autopilot_markdown() -> str:
    """The autopilot's settings (`GET/PUT /api/autopilot`, `moescope serve --autopilot`)."""
    from tuning.autopilot.settings import AutopilotSettings

    return model_markdown(AutopilotSettings)


PYTHON_KINDS: dict[Any, str] = {int: "integer", float: "number", str: "string"}


def telemetry_markdown() -> str:
    """`StepTelemetry`'s fields and those of its parts (`engine/telemetry.py`)."""
    from engine.telemetry import StepTelemetry

    rows = []
    for name, field in StepTelemetry.model_fields.items():
        kind = field.annotation
        if inspect.isclass(kind) and issubclass(kind, BaseModel):
            parts = ", ".join(f"`{n}`" for n in kind.model_fields)
            rows.append([f"`{name}`", f"`{kind.__name__}`", parts])
        else:
            args = typing.get_args(kind)
            inner = args[0] if args and inspect.isclass(args[0]) else None
            if inner is not None and issubclass(inner, BaseModel):
                parts = ", ".join(f"`{n}`" for n in inner.model_fields)
                rows.append([f"`{name}`", f"list of `{inner.__name__}`", parts])
            else:
                rows.append([f"`{name}`", PYTHON_KINDS.get(kind, str(kind)), ""])
    return table(["field", "type", "its fields"], rows)


# -- command line ------------------------------------------------------------------------


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    """Defaults read from the environment ($MOESCOPE_DB) as on a machine without it."""
    saved = {k: os.environ.pop(k) for k in ("MOESCOPE_DB",) if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _default_text(action: argparse.Action) -> str:
    default = action.default
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return ""
    if default is None or default == argparse.SUPPRESS:
        return ""
    if dataclasses.is_dataclass(default) and hasattr(default, "kind"):  # a length distribution
        words = [str(default.kind)]
        for field in dataclasses.fields(default):
            value = getattr(default, field.name)
            if field.name != "kind" and value != field.default:
                words.append(_number(value))
        return f"`{':'.join(words)}`"
    if isinstance(default, list):
        return f"`{','.join(map(str, default))}`"
    if isinstance(default, float) and math.isfinite(default):
        return f"`{_number(default)}`"
    return f"`{default}`"


BUILTIN_KINDS = {int: "an integer", float: "a number", Path: "a path"}


def _checked_as(kind: Any) -> str | None:
    """What an argparse type from `cli.args` accepts (the `wanted` its check names)."""
    if kind in BUILTIN_KINDS:
        return BUILTIN_KINDS[kind]
    with contextlib.suppress(TypeError, ValueError):
        wanted = inspect.getclosurevars(kind).nonlocals.get("wanted")
        if isinstance(wanted, str):
            return wanted
    return None


def _value_text(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    name = str(action.metavar or action.dest.upper())
    checked = _checked_as(action.type)
    return f"{name}: {checked}" if checked else name


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            text = text % {**vars(action), "prog": "moescope"}
    return cell(text)


def _command_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest.upper()}`"
        if action.required and action.option_strings:
            name += " (required)"
        rows.append([name, _value_text(action), _default_text(action), _help_text(action)])
    return rows


def _subcommands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command words, help, parser) for every subcommand, depth first, in declared order."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            words = f"{prefix} {name}"
            yield words, helps.get(name, ""), sub
            yield from _subcommands(sub, words)


def cli_markdown() -> str:
    """Every `moescope` subcommand with its arguments (from `cli.main.build_parser`)."""
    with _plain_environment():
        from cli.main import build_parser

        parser = build_parser()
    parts = []
    for words, help_text, sub in _subcommands(parser, "moescope"):
        rows = _command_rows(sub)
        if not rows:
            continue
        parts.append(f"#### `{words}`\n\n{cell(help_text)}\n\n")
        parts.append(table(["argument", "value", "default", "help"], rows) + "\n\n")
    return "".join(parts).rstrip()


# -- routes ------------------------------------------------------------------------------


def route_modules() -> list[Any]:
    """The modules of `api/` that declare `router = APIRouter()`, in name order."""
    from fastapi import APIRouter

    import api

    out = []
    for info in sorted(pkgutil.iter_modules(api.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"api.{info.name}")
        if isinstance(getattr(module, "router", None), APIRouter):
            out.append(module)
    return out


def _summary(endpoint: Callable[..., Any]) -> str:
    """The first paragraph of a route's docstring."""
    return (inspect.getdoc(endpoint) or "").split("\n\n")[0]


def _body_text(annotation: Any) -> str:
    """A body's model (`CompletionRequest`, `RebalanceRequest` (optional)) or `JSON object`."""
    members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    optional = type(None) in members
    kinds = [m for m in members if m is not type(None)] or [annotation]
    names = [k.__name__ if inspect.isclass(k) else "JSON object" for k in kinds]
    return " \\| ".join(f"`{n}`" for n in names) + (" (optional)" if optional else "")


def route_rows() -> list[dict[str, str]]:
    """Each route: methods, path, query parameters with defaults, body, module, summary."""
    from fastapi.routing import APIRoute, APIWebSocketRoute

    rows = []
    for module in route_modules():
        for route in module.router.routes:
            if isinstance(route, APIWebSocketRoute):
                methods = ["WS"]
            elif isinstance(route, APIRoute):
                methods = sorted(route.methods or ())
            else:
                continue
            query = []
            for param in route.dependant.query_params:
                info = param.field_info
                name = info.alias or param.name
                shown = "" if info.is_required() or info.default is None else f"={info.default}"
                query.append(f"`{name}{shown}`")
            body = ", ".join(
                _body_text(p.field_info.annotation) for p in route.dependant.body_params
            )
            for method in methods:
                rows.append(
                    {
                        "method": method,
                        "path": route.path,
                        "query": ", ".join(query),
                        "body": body,
                        "module": f"api/{module.__name__.split('.')[-1]}.py",
                        "summary": _summary(route.endpoint),
                    }
                )
    rows.sort(key=lambda r: (r["path"], r["method"]))
    return rows


def endpoints_markdown() -> str:
    """The route table: every route in `api/`'s routers."""
    rows = [
        [
            f"`{r['method']} {r['path']}`",
            r["query"],
            r["body"],
            f"`{r['module']}`",
            cell(r["summary"]),
        ]
        for r in route_rows()
    ]
    return table(["route", "query", "body", "module", "what"], rows)


# -- errors ------------------------------------------------------------------------------


def errors_markdown() -> str:
    """HTTP statuses and the OpenAI error `type` each carries (`api.errors.ERROR_TYPES`)."""
    from api.errors import ERROR_TYPES, error_body

    rows = [[str(status), f"`{kind}`"] for status, kind in sorted(ERROR_TYPES.items())]
    rows.append(["any other", f"`{error_body(599, '')['error']['type']}`"])
    return table(["status", "`error.type`"], rows)


SECTIONS: dict[str, Callable[[], str]] = {
    "sampling": sampling_markdown,
    "knobs": knobs_markdown,
    "telemetry": telemetry_markdown,
    "autopilot": autopilot_markdown,
    "cli": cli_markdown,
    "endpoints": endpoints_markdown,
    "errors": errors_markdown,
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(text: str, name: str) -> str:
    """The text between section `name`'s markers in `text` (ValueError if they are missing)."""
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"docs/reference.md has no {begin} ... {end} section")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def render(text: str, generated: dict[str, str] | None = None) -> str:
    """`text` with every generated section replaced by what the code gives now."""
    generated = generated if generated is not None else {n: f() for n, f in SECTIONS.items()}
    for name, body in generated.items():
        begin, end = markers(name)
        section(text, name)  # both markers present
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return text


def stale_sections(text: str) -> list[str]:
    """The names of the sections of `text` that differ from what the code gives now."""
    return [name for name, f in SECTIONS.items() if section(text, name) != f().strip("\n")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.make_reference", description=__doc__)
    parser.add_argument("--path", type=Path, default=REFERENCE_PATH)
    parser.add_argument("--check", action="store_true", help="only say which sections are stale")
    args = parser.parse_args(argv)
    text = args.path.read_text()
    if args.check:
        stale = stale_sections(text)
        if stale:
            print(f"{args.path}: out of date: {', '.join(stale)} (python -m docs.make_reference)")
            return 1
        print(f"{args.path}: up to date")
        return 0
    new = render(text)
    if new != text:
        args.path.write_text(new)
        print(f"wrote {args.path}")
    else:
        print(f"{args.path}: already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
