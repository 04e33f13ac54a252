"""The knob sets the autopilot weighs: one step up or down for each knob it may move, the moves
the attribution points at first, kept within bounds and consistent with each other."""

from typing import Any

from engine.knobs import Knobs
from tuning.autopilot_settings import AutopilotSettings

# what a dominant cause says to try first: (knob, +1 up / -1 down)
HINTS: dict[str, list[tuple[str, int]]] = {
    "queue_slots": [("max_num_seqs", 1)],
    "queue_budget": [("max_num_batched_tokens", 1), ("prefill_chunk_size", 1)],
    "interference": [("prefill_chunk_size", -1)],
    "decode_tax": [("prefill_chunk_size", -1), ("max_num_batched_tokens", -1)],
    "decode": [("max_num_seqs", -1)],
    "queue_kv": [("max_num_seqs", -1)],
}
MAX_MOVES = 3  # twin runs per decision: each costs CPU beside the engine


def moved(value: int, direction: int, factor: float, lo: int, hi: int) -> int:
    """One step of `value` by `factor` up or down, within [lo, hi]."""
    new = round(value * factor) if direction > 0 else round(value / factor)
    if new == value:
        new = value + direction
    return min(hi, max(lo, new))


def consistent(values: dict[str, Any], knob: str) -> dict[str, Any]:
    """`values` with the other knobs pulled along so that the set validates: the budget holds
    every slot and a whole chunk. `knob` is the one moved, which the others follow."""
    out = dict(values)
    if knob == "max_num_batched_tokens":
        out["max_num_seqs"] = min(out["max_num_seqs"], out["max_num_batched_tokens"])
        out["prefill_chunk_size"] = min(out["prefill_chunk_size"], out["max_num_batched_tokens"])
    else:
        need = max(out["max_num_seqs"], out["prefill_chunk_size"])
        out["max_num_batched_tokens"] = max(out["max_num_batched_tokens"], need)
    return out


def moves(
    knobs: Knobs,
    settings: AutopilotSettings,
    causes: list[str],
    banned: set[tuple[str, int]],
) -> list[tuple[dict[str, Any], tuple[str, int]]]:
    """Up to MAX_MOVES candidate knob changes with the (knob, direction) each makes: those the
    `causes` (most to least dominant) hint at first, then every other single step. A banned
    (knob, direction), one rolled back lately, is left out, as is a move that changes
    nothing."""
    order = [hint for cause in causes for hint in HINTS.get(cause, [])]
    order += [(k, d) for k in settings.knobs for d in (1, -1)]
    current = knobs.model_dump()
    out: list[tuple[dict[str, Any], tuple[str, int]]] = []
    seen: list[dict[str, Any]] = []
    for knob, direction in order:
        if knob not in settings.knobs or (knob, direction) in banned:
            continue
        value = current[knob]
        if knob == "prefill_chunk_size" and value == 0:
            value = current["max_num_batched_tokens"]  # unchunked: a chunk as big as the budget
        b = settings.knobs[knob]
        values = consistent(
            {**current, knob: moved(value, direction, settings.max_factor, b.lo, b.hi)}, knob
        )
        changes = {k: v for k, v in values.items() if v != current[k]}
        if changes and changes not in seen:
            seen.append(changes)
            out.append((changes, (knob, direction)))
    if settings.allow_policy and ("policy", 0) not in banned:
        flip = "shortest_first" if knobs.policy == "fcfs" else "fcfs"
        out.insert(min(len(out), 2), ({"policy": flip}, ("policy", 0)))
    return out[:MAX_MOVES]
