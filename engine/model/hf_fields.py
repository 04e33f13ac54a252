"""config.json read and its fields checked: a reader refuses a missing required key, a value
of the wrong type or out of range, naming the key."""

import json
import math
from pathlib import Path
from typing import Any


def refuse(cond: bool, message: str) -> None:
    if cond:
        raise ValueError(message)


def read_config(path: Path) -> dict[str, Any]:
    """The JSON object in `path`/config.json."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    refuse(
        not isinstance(config, dict),
        f"{file} must hold a JSON object, not a {type(config).__name__}",
    )
    return config


_REQUIRED: Any = object()


def field(c: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = _REQUIRED) -> Any:
    """`c[key]` checked against `kinds` (a bool is no number); null or absent gives `default`."""
    value = c.get(key)
    if value is None:
        refuse(default is _REQUIRED, f"config.json is missing the required key {key!r}")
        return default
    wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    expected = " or ".join(k.__name__ for k in kinds)
    refuse(wrong, f"config.json: {key!r} must be {expected}, got {value!r}")
    return value


def int_field(c: dict[str, Any], key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
    """An integer of at least `minimum` (or `default` when absent)."""
    value = field(c, key, (int,), default)
    refuse(
        c.get(key) is not None and value < minimum,
        f"config.json: {key!r} must be at least {minimum}, got {value!r}",
    )
    return value


def number_field(c: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """A positive finite number (or `default` when absent)."""
    value = field(c, key, (int, float), default)
    refuse(
        c.get(key) is not None and not 0 < value < math.inf,
        f"config.json: {key!r} must be a positive finite number, got {value!r}",
    )
    return value


def bool_field(c: dict[str, Any], key: str, default: bool = False) -> bool:
    return field(c, key, (bool,), default)


def first_set(c: dict[str, Any], *keys: str) -> str:
    """The first of `keys` that the config sets (not null), else the last."""
    return next((k for k in keys if c.get(k) is not None), keys[-1])
