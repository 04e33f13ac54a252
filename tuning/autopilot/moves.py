"""The knob sets the autopilot weighs: one step up or down for each knob it may move, the moves
the attribution points at first (and, on a shift in the load, its hinted steps together), kept
within bounds and consistent with each other."""

from collections.abc import Sequence
from typing import Any

from engine.knobs import Knobs
from tuning.autopilot.settings import AutopilotSettings

Step = tuple[str, int]  # (knob, +1 up / -1 down; 0 for the policy's flip)
Move = tuple[Step, ...]  # the steps one candidate makes together
# what a dominant cause says to try first
HINTS: dict[str, list[Step]] = {
    "queue_slots": [("max_num_seqs", 1)],
    "queue_budget": [("max_num_batched_tokens", 1), ("prefill_chunk_size", 1)],
    "interference": [("prefill_chunk_size", -1)],
    "decode_tax": [("prefill_chunk_size", -1), ("max_num_batched_tokens", -1)],
    "decode": [("max_num_seqs", -1)],
    "queue_kv": [("max_num_seqs", -1)],
}
MAX_MOVES = 3  # twin runs per decision: each costs CPU beside the engine


def step_value(value: int, direction: int, factor: float, lo: int, hi: int) -> int:
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


def step_changes(
    current: dict[str, Any], settings: AutopilotSettings, steps: Move
) -> dict[str, Any]:
    """The knobs that `steps` change, one after another, with the others they pull along."""
    values = dict(current)
    for knob, direction in steps:
        value = values[knob]
        if knob == "prefill_chunk_size" and value == 0:
            value = values["max_num_batched_tokens"]  # unchunked: a chunk as big as the budget
        b = settings.knobs[knob]
        new = step_value(value, direction, settings.max_factor, b.lo, b.hi)
        values = consistent({**values, knob: new}, knob)
    return {k: v for k, v in values.items() if v != current[k]}


def moves(
    knobs: Knobs,
    settings: AutopilotSettings,
    causes: Sequence[str],
    banned: set[Move],
    together: Sequence[str] = (),
) -> list[tuple[dict[str, Any], Move]]:
    """Up to MAX_MOVES candidate knob changes with the steps each makes: those the `causes`
    (most to least dominant) hint at first, then every other single step. `together`'s hints
    (a shift's causes), when they move two knobs or more, are weighed first as one candidate
    as well, beyond MAX_MOVES: each change is measured for observe_s before the next may come,
    so a shift that needs two steps settled one change later when it took them one by one.
    A banned move (one rolled back lately), or a candidate with a banned step, is left out, as
    is a move that changes nothing."""
    current = knobs.model_dump()
    steps = [hint for cause in causes for hint in HINTS.get(cause, [])]
    steps += [(k, d) for k in settings.knobs for d in (1, -1)]
    out: list[tuple[dict[str, Any], Move]] = []
    seen: list[dict[str, Any]] = []

    def add(move: Move) -> None:
        if move in banned or any((step,) in banned for step in move):
            return
        changes = step_changes(current, settings, move)
        if changes and changes not in seen:
            seen.append(changes)
            out.append((changes, move))

    add(combined_move(current, settings, together))
    first = len(out)  # the combined candidate, if any
    for step in steps:
        if step[0] in settings.knobs:
            add((step,))
    if settings.allow_policy and (("policy", 0),) not in banned:
        flip = "shortest_first" if knobs.policy == "fcfs" else "fcfs"
        out.insert(min(len(out), first + 2), ({"policy": flip}, (("policy", 0),)))
    return out[: first + MAX_MOVES]


def combined_move(
    current: dict[str, Any], settings: AutopilotSettings, causes: Sequence[str]
) -> Move:
    """The steps the `causes` hint at, the first for each knob that can move, if they are two
    or more; else none."""
    steps: list[Step] = []
    for step in (hint for cause in causes for hint in HINTS.get(cause, [])):
        fresh = step[0] in settings.knobs and step[0] not in {k for k, _ in steps}
        if fresh and step_changes(current, settings, (step,)):
            steps.append(step)
    return tuple(steps) if len(steps) >= 2 else ()
