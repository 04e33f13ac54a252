"""Live knobs: the model validated as a whole, its schema, and errors that name the field."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from engine.ep.placement import max_replicas
from engine.errors import InvalidInput


class Knobs(BaseModel):
    """Live scheduling and capacity knobs, validated as a whole (strict: no True for 1, no
    "8" or 8.0 for 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_num_seqs: int = Field(64, ge=1, le=4096, description="batch slots")
    max_num_batched_tokens: int = Field(2048, ge=1, le=1 << 20, description="token budget per step")
    prefill_chunk_size: int = Field(512, ge=0, le=1 << 20, description="0 = no chunking")
    policy: Literal["fcfs", "priority", "shortest_first"] = "fcfs"
    kv_capacity_blocks: int | None = Field(
        None, ge=1, description="usable KV blocks (null = all allocated)"
    )
    kv_watermark: float = Field(
        0.01, ge=0.0, le=0.5, description="fraction of usable blocks kept free before admitting"
    )
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    expert_capacity_factor: float | None = Field(
        None, gt=0.0, le=64.0, description="null = dropless"
    )
    eplb_interval_steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="rebalance expert placement every N steps (null = off; needs ep_size > 1)",
    )
    eplb_replicas: int = Field(
        0, ge=0, le=1024, description="redundant replicas of hot experts per layer on rebalance"
    )

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "Knobs":
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidInput(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}) so every slot can decode one token",
                "max_num_batched_tokens",
            )
        if self.prefill_chunk_size > self.max_num_batched_tokens:
            raise InvalidInput(
                f"prefill_chunk_size ({self.prefill_chunk_size}) must not exceed "
                f"max_num_batched_tokens ({self.max_num_batched_tokens})",
                "prefill_chunk_size",
            )
        ctx: dict[str, Any] = info.context or {}
        total = ctx.get("total_blocks")
        if total is not None and self.kv_capacity_blocks is not None:
            if self.kv_capacity_blocks > total:
                raise InvalidInput(
                    f"kv_capacity_blocks ({self.kv_capacity_blocks}) must be at most the "
                    f"{total} blocks allocated",
                    "kv_capacity_blocks",
                )
            needed = ctx.get("min_blocks", 1)
            if self.kv_capacity_blocks < needed:
                raise InvalidInput(
                    f"kv_capacity_blocks ({self.kv_capacity_blocks}) must be at least {needed}: "
                    "the largest live request needs that many blocks to finish",
                    "kv_capacity_blocks",
                )
        self._check_eplb(ctx)
        max_len = ctx.get("max_model_len")
        unchunked = self.prefill_chunk_size == 0
        if unchunked and max_len is not None and self.max_num_batched_tokens < max_len:
            raise InvalidInput(
                f"prefill_chunk_size 0 (no chunking) needs max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) of at least max_model_len ({max_len})",
                "prefill_chunk_size",
            )
        return self

    def _check_eplb(self, ctx: dict[str, Any]) -> None:
        ep_size, experts = ctx.get("ep_size"), ctx.get("num_experts")
        if self.eplb_interval_steps is not None and ep_size == 1:
            raise InvalidInput(
                "eplb_interval_steps needs expert parallel (ep_size > 1); "
                "this engine runs ep_size 1",
                "eplb_interval_steps",
            )
        if (
            experts is not None
            and ep_size is not None
            and self.eplb_replicas > max_replicas(experts, ep_size)
        ):
            raise InvalidInput(
                f"eplb_replicas ({self.eplb_replicas}) must be at most "
                f"{max_replicas(experts, ep_size)} ({experts} experts x "
                f"{ep_size - 1} other ranks)",
                "eplb_replicas",
            )


def knob_schema(total_blocks: int) -> dict[str, dict[str, Any]]:
    """Each knob's type, allowed range or values, nullability, default and description."""
    out: dict[str, dict[str, Any]] = {}
    for name, prop in Knobs.model_json_schema()["properties"].items():
        entry: dict[str, Any] = {
            "default": prop.get("default"),
            "description": prop.get("description", ""),
            "nullable": False,
        }
        for option in prop.get("anyOf", [prop]):
            if option.get("type") == "null":
                entry["nullable"] = True
                continue
            entry["type"] = option.get("type")
            for key, label in (
                ("minimum", "minimum"),
                ("maximum", "maximum"),
                ("exclusiveMinimum", "exclusive_minimum"),
                ("enum", "enum"),
            ):
                if key in option:
                    entry[label] = option[key]
        out[name] = entry
    out["kv_capacity_blocks"]["maximum"] = total_blocks
    for entry in out.values():
        entry["allowed"] = _allowed(entry)
    return out


def _allowed(entry: dict[str, Any]) -> str:
    if "enum" in entry:
        text = "one of " + ", ".join(map(str, entry["enum"]))
    else:
        low = entry.get("minimum", entry.get("exclusive_minimum", "-inf"))
        left = "(" if "exclusive_minimum" in entry else "["
        text = f"{left}{low}, {entry.get('maximum', 'inf')}]"
    return text + (" or null" if entry["nullable"] else "")


def validate_knobs(values: dict[str, Any], context: dict[str, Any]) -> Knobs:
    """The knob set for `values`, or InvalidInput naming every bad field (the first as `param`)
    with its allowed range. `context` holds what a range depends on: total_blocks, min_blocks
    (of the largest live request), max_model_len, ep_size, num_experts."""
    try:
        return Knobs.model_validate(values, context=context)
    except ValidationError as exc:
        raise _knob_error(exc, knob_schema(context["total_blocks"])) from None


def _knob_error(exc: ValidationError, schema: dict[str, dict[str, Any]]) -> InvalidInput:
    parts: list[str] = []
    first: str | None = None
    for err in exc.errors():
        name: str | None = ".".join(map(str, err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        cause = err.get("ctx", {}).get("error")
        if name in schema:
            parts.append(f"{name}: {msg} (allowed: {schema[name]['allowed']})")
        elif name:
            parts.append(f"{name}: {msg} (known knobs: {', '.join(schema)})")
        else:
            parts.append(msg)
            name = cause.param if isinstance(cause, InvalidInput) else None
        first = first or name or None
    return InvalidInput("; ".join(parts), first)
