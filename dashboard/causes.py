"""One fixed colour per latency cause (tuning/attribution.py's CAUSES), shared by every
attribution figure so a cause looks the same wherever it shows."""

# queueing in warm colours, prefill in greens, decode in blues, the rest apart
COLOURS = {
    "queue_slots": "#d62728",
    "queue_budget": "#ff7f0e",
    "queue_kv": "#e377c2",
    "queue_priority": "#bcbd22",
    "queue_swapped": "#c5b0d5",
    "queue_static": "#f7b6d2",
    "queue_busy": "#ffbb78",
    "prefill": "#2ca02c",
    "interference": "#98df8a",
    "preemption": "#9467bd",
    "overhead": "#7f7f7f",
    "decode": "#1f77b4",
    "decode_tax": "#aec7e8",
    "straggler": "#17becf",
}
UNKNOWN = "#c7c7c7"  # a cause added on the server after this mapping
PHASE_CAUSE = {"prefill": "prefill", "decode": "decode", "preempted": "preemption"}


def colour(cause: str | None) -> str:
    return COLOURS.get(cause or "", UNKNOWN)


def phase_colour(phase: str, cause: str | None) -> str:
    """A waterfall bar's colour: a wait takes its cause's, the other phases their own."""
    return colour(cause if phase == "waiting" else PHASE_CAUSE.get(phase))


def ordered(causes: set[str]) -> list[str]:
    """`causes` in COLOURS' order (a stable stacking order), unknown ones last by name."""
    known = [c for c in COLOURS if c in causes]
    return known + sorted(causes - set(COLOURS))
