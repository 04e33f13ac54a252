"""The live twin: the cost model fitted from the engine's recent steps, and a trace that starts
from the queue as it stands and lays the recent arrivals over the horizon."""

import itertools
import math
import random
from typing import Any

from engine.errors import InvalidInput
from engine.knobs import Knobs, validate_knobs
from engine.queue_snapshot import QueuedRequest, QueueSnapshot
from engine.telemetry import KnobChange
from tuning.twin.cost_model import Rows, fit_rows
from tuning.twin.experts import ExpertDraw, Routing
from tuning.twin.trace import TraceItem, blocks_needed
from tuning.twin.whatif import Twin, engine_setup

ARRIVAL_WINDOW_S = 60.0  # the recent arrivals that the horizon repeats
MIN_WINDOW_S = 10.0  # a younger server still repeats this much, so a first burst is not a rate
MAX_STRETCH = 3.0  # the horizon stretches at most this many times (the twin's CPU grows with it)


def arrival_window(uptime_s: float) -> float:
    """Seconds of recent arrivals to repeat: the last ARRIVAL_WINDOW_S, or all a younger server
    has seen, but not less than MIN_WINDOW_S."""
    return min(ARRIVAL_WINDOW_S, max(MIN_WINDOW_S, uptime_s))


def knobs_at(knobs: Knobs, changes: list[KnobChange], version: int) -> dict[str, Any]:
    """The knobs in force at `version`: `knobs` (in force after every change in `changes`)
    with the changes newer than `version` undone, newest first."""
    out = knobs.model_dump()
    for change in sorted(changes, key=lambda c: c.version, reverse=True):
        if change.version > version:
            out.update({k: old for k, (old, _) in change.changes.items() if k in out})
    return out


def live_trace(
    queued: list[QueuedRequest],
    recent: list[dict[str, Any]],
    now: float,
    window_s: float,
    horizon_s: float,
) -> list[TraceItem]:
    """The trace from `now` on: the queued requests first, in the engine's order, all due at
    once; then the arrivals of the last `window_s` seconds (ended RequestRecord dicts in
    `recent`, and the queued requests) laid over the horizon, in time order (see
    `_over_horizon`); any drawn at random are seeded by `now`, so that every knob set weighed
    at one look meets the same arrivals.

    A queued request with output so far enters at 0 with its prompt and output as its
    prompt and the rest of its max_tokens to go: a running one with all but its last token in
    KV (it decodes on), a swapped or preempted one to prefill again. One without output keeps
    its arrival (before 0), so its TTFT counts the wait so far."""
    items = [_queued_item(q, now) for q in queued]
    future = _over_horizon(_pattern(queued, recent, now, window_s), window_s, horizon_s, now)
    return items + sorted(future, key=lambda item: item.offset_s)


def _queued_item(q: QueuedRequest, now: float) -> TraceItem:
    if not q.generated:
        return TraceItem(q.arrival - now, q.prompt_len, q.max_tokens, q.priority)
    size = q.prompt_len + q.generated
    # re-prefilling a running request's 1000-1800 tokens put seconds of prefill at the start
    # of a long-prompt phase's horizon: the twin predicted 20-25 points too low there
    computed = size - 1 if q.state == "running" else 0
    return TraceItem(0.0, size, q.max_tokens - q.generated, q.priority, computed)


def stretched_horizon(
    queued: list[QueuedRequest],
    recent: list[dict[str, Any]],
    now: float,
    window_s: float,
    horizon_s: float,
    min_requests: int,
) -> float:
    """`horizon_s`, or as much longer (up to MAX_STRETCH times) as `live_trace` needs to hold
    `min_requests`: the queued ones and the arrivals of the last `window_s` at their rate."""
    arrivals = len(_pattern(queued, recent, now, window_s))
    if not arrivals:
        return horizon_s
    needed = (min_requests - len(queued)) * window_s / arrivals
    return min(max(horizon_s, needed), MAX_STRETCH * horizon_s)


def _pattern(
    queued: list[QueuedRequest], recent: list[dict[str, Any]], now: float, window_s: float
) -> list[tuple[float, int, int, int]]:
    """(seconds ago, prompt, output, priority) of the arrivals of the last `window_s` with
    output to come: ended RequestRecord dicts in `recent`, and the queued requests."""
    pattern = [
        (r["arrival"], r["prompt_len"], r["output_len"], r.get("priority") or 0) for r in recent
    ]
    pattern += [(q.arrival, q.prompt_len, q.max_tokens, q.priority) for q in queued]
    return [(now - a, p, n, pr) for a, p, n, pr in pattern if now - a <= window_s and n > 0]


def _over_horizon(
    pattern: list[tuple[float, int, int, int]], window_s: float, horizon_s: float, seed: float
) -> list[TraceItem]:
    """The arrivals in `pattern` ((seconds ago, prompt, output, priority)) laid over the
    horizon at the window's rate: drawn (`_drawn`, seeded by `seed`) when the window is
    shorter than the horizon, else squeezed in (`_squeezed`)."""
    if window_s <= 0:
        return []
    if window_s < horizon_s:
        return _drawn(pattern, window_s, horizon_s, random.Random(seed))
    return _squeezed(sorted(pattern), window_s, horizon_s)


def _drawn(
    pattern: list[tuple[float, int, int, int]],
    window_s: float,
    horizon_s: float,
    rng: random.Random,
) -> list[TraceItem]:
    """Poisson arrivals over the horizon at the rate of those in `pattern` (over `window_s`),
    each a copy of one of them drawn at random: a window too short to fill the horizon with
    its own arrivals. Repeating it laid its few arrivals out evenly, where bunches that a
    Poisson process makes by chance are what queue: at a shift's look (a 5 s window) in a
    phase of long prompts the twin predicted 91-95% attainment where 72-81% was measured;
    drawn, 71-81% against 75-82% (two runs of benchmarks/control/live_twin.py)."""
    if not pattern:
        return []
    rate = len(pattern) / window_s
    out, t = [], rng.expovariate(rate)
    while t <= horizon_s:
        _, prompt, output, priority = rng.choice(pattern)
        out.append(TraceItem(t, prompt, output, priority))
        t += rng.expovariate(rate)
    return out


def _squeezed(
    pattern: list[tuple[float, int, int, int]], window_s: float, horizon_s: float
) -> list[TraceItem]:
    """An evenly spaced horizon / window share of the arrivals in `pattern` (newest first),
    so the lengths of the whole window count, not only those of its last `horizon_s`. The
    first comes as long from now as the newest arrived ago, and each is followed by the gap
    that followed it back in the window, all scaled to span the horizon (the window's rate).
    Keeping a request's own gap keeps the arrivals bunched as they came: squeezing their
    times instead spaced them evenly, and the twin's p90 TPOT under a 2048-token budget was
    25 ms against 34 measured, under-rating what a smaller budget gains."""
    share = horizon_s / window_s
    ages = [ago for ago, *_ in pattern] + [window_s]
    # the i-th arrival is kept when the running count i * share, rounded, steps up at it
    kept = [
        i
        for i in range(len(pattern))
        if math.floor((i + 1) * share + 0.5) > math.floor(i * share + 0.5)
    ]
    offsets = list(itertools.accumulate((ages[i + 1] - ages[i] for i in kept), initial=ages[0]))
    scale = horizon_s / max(offsets[-1], 1e-9)
    return [TraceItem(offsets[k] * scale, *pattern[i][1:]) for k, i in enumerate(kept)]


def twin_from_live(
    config: dict[str, Any],
    routing: Routing,
    rows: Rows,
    recent: list[dict[str, Any]],
    snapshot: QueueSnapshot,
    window_s: float,
    horizon_s: float,
    version: int | None = None,
) -> tuple[Twin, list[str]]:
    """The live engine's twin and the approximations it makes, as sentences.

    `config` describes the engine (as /api/status); `routing` holds its recent steps' expert
    loads (which the twin draws from), `rows` the cost model's training rows
    (`tuning.twin.fit_rows`) and `recent` its recently ended RequestRecord dicts; `snapshot` holds
    the queue and every knob change applied since `version`. The twin's knobs are those in
    force at `version` (default: at the snapshot).
    Raises InvalidInput (`source`) when the rows are too few to fit, or no step routed any
    token yet (rows seeded from an earlier run, `--fit-from`, before a request ran)."""
    setup, context = engine_setup(config)
    try:
        model = fit_rows(rows)
    except InvalidInput as exc:
        raise InvalidInput(f"the live engine has seen too few steps: {exc}", "source") from None
    if not len(routing.counts):
        raise InvalidInput(
            "the live engine has routed no token yet: no expert loads to draw from", "source"
        )
    trace = live_trace(snapshot.requests, recent, snapshot.t, window_s, horizon_s)
    # as the engine does: a knob change may not shrink the cache below a live request's need
    queued = trace[: len(snapshot.requests)]
    context["min_blocks"] = blocks_needed(queued, setup.cache.block_size, setup.max_model_len)
    at = snapshot.knobs_version if version is None else version
    knobs = validate_knobs(knobs_at(snapshot.knobs, snapshot.knob_changes, at), context)
    twin = Twin(setup, knobs, trace, model, ExpertDraw(routing), context)
    return twin, _notes(snapshot, len(trace), window_s, horizon_s)


def _notes(snapshot: QueueSnapshot, size: int, window_s: float, horizon_s: float) -> list[str]:
    queued = len(snapshot.requests)
    return [
        f"the {queued} requests in the engine now enter the simulation at once: those with "
        "output so far count their TTFT and TPOT from now, the running ones decoding on with "
        "their KV cache in place, swapped or preempted ones prefilling their prompt and "
        "output again (no host copy is carried over); those without output keep their "
        "arrival, so their TTFT counts the wait so far",
        f"new arrivals follow the last {window_s:.1f} s: {_arrivals_text(window_s, horizon_s)} "
        f"({size - queued} within the {horizon_s:g} s horizon, lengths as recorded; requests "
        "still in the engine are taken to run to max_tokens)",
    ]


def _arrivals_text(window_s: float, horizon_s: float) -> str:
    if window_s < horizon_s:
        return (
            "Poisson arrivals at their rate, each a copy of one of them drawn at random (a "
            "window shorter than the horizon, repeated, would space them evenly)"
        )
    share = horizon_s / window_s
    return (
        f"squeezed into the horizon at the same rate: an evenly spaced {share:.0%} of them "
        "arrive again, newest first, each followed by the gap that followed it back in the "
        "window (scaled to span the horizon), so they bunch as they came"
    )
