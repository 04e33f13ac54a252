"""A recorded session's request trace: when each request arrived and how long it was."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TraceItem:
    offset_s: float  # arrival, from the first arrival
    prompt_len: int
    output_len: int
    priority: int = 0  # SamplingParams.priority
    computed: int = 0  # tokens already in KV: a request the live engine is running
    prompt_token_ids: tuple[int, ...] | None = None  # recorded (serve --record-prompts)


def trace_of(records: list[dict[str, Any]]) -> list[TraceItem]:
    """Arrival offsets and lengths of request records (RequestRecord dicts), in arrival order.

    Requests that ended before their first token (aborted while queued, failed) are left out:
    nothing says how long they would have run."""
    served = sorted((r for r in records if r["output_len"] > 0), key=lambda r: r["arrival"])
    t0 = served[0]["arrival"] if served else 0.0
    return [
        TraceItem(
            r["arrival"] - t0,
            r["prompt_len"],
            r["output_len"],
            r.get("priority") or 0,
            prompt_token_ids=tuple(ids) if (ids := r.get("prompt_token_ids")) else None,
        )
        for r in served
    ]


def blocks_needed(items: list[TraceItem], block_size: int, max_len: int) -> int:
    """KV blocks the largest of `items` holds by its end (as the engine counts a live request's
    need when a knob change would shrink the cache); 1 for none."""
    return max(
        (-(-min(t.prompt_len + t.output_len, max_len) // block_size) for t in items), default=1
    )
