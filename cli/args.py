"""Argument checks and error lines shared by the `moescope` commands.

Each check is an argparse `type=`, so a bad value is argparse's one-line `error:` (exit 2);
`describe` turns any other error into the text of a one-line exit message.
"""

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import pydantic

from server.settings import ServerSettings
from tuning.autopilot.settings import AutopilotSettings, parse_targets

T = TypeVar("T")


def _checked(
    convert: Callable[[str], T], ok: Callable[[T], bool], wanted: str
) -> Callable[[str], T]:
    """An argparse type: `convert`, then refuse values that are not `ok` as not `wanted`."""

    def parse(text: str) -> T:
        try:
            value: T | None = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= `low`."""
    return _checked(int, lambda v: v >= low, f"an integer >= {low}")


positive = _checked(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
non_negative = _checked(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
port = _checked(int, lambda v: 1 <= v <= 65535, "a port number from 1 to 65535")
threads = _checked(
    lambda t: t if t == "auto" else int(t),
    lambda v: v == "auto" or (isinstance(v, int) and v >= 1),
    "'auto' or an integer >= 1",
)


def kv_cache_args(args: argparse.Namespace) -> dict[str, int | float]:
    """The device KV cache's size as engine arguments (serve, generate, fleet): its MiB when
    --kv-cache-memory-mib is given, else --kv-blocks."""
    if args.kv_cache_memory_mib is not None:
        return {"kv_cache_memory_mib": args.kv_cache_memory_mib}
    return {"num_kv_blocks": args.kv_blocks}


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """The server's settings from `serve`'s arguments (a fleet replica's too)."""
    return ServerSettings.from_env(
        model_name=args.served_model_name or args.model,
        api_key=args.api_key,
        admin_key=args.admin_key,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens_limit=args.max_tokens_limit,
        ws_buffer=args.ws_buffer,
        metrics=not args.no_metrics,
        db_url=args.db,
        record=not args.no_record,
        record_buffer=args.record_buffer,
        whatif_horizon_s=args.whatif_horizon,
        autopilot=args.autopilot or AutopilotSettings(),
        fit_from=args.fit_from,
    )


def serve_engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine arguments of `serve` (a fleet replica's too): `--ep` runs real ranks,
    `--ep-size` models them."""
    return dict(
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        ep_size=args.ep or args.ep_size,
        ep_distributed=args.ep is not None,
        router_skew=args.router_skew,
        threads=args.threads,
        record_prompts=args.record_prompts,
        overlap=args.overlap,
        **kv_cache_args(args),
    )


def describe(exc: BaseException) -> str:
    """An exception as one line: its message (a file error's reason), else its type's name."""
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return f"{where}: {first['msg']}" if where else first["msg"]
    if isinstance(exc, OSError) and (exc.errno or exc.strerror):
        # the errno's own text: pyarrow puts a whole message in strerror
        return os.strerror(exc.errno) if exc.errno else str(exc.strerror)
    return " ".join(str(exc).split()) or type(exc).__name__


def autopilot_targets(text: str) -> AutopilotSettings:
    """`--autopilot ttft_p90_ms=800,tpot_p90_ms=60`: enabled autopilot settings."""
    try:
        return parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
