"""A shift in the load, seen in the arrivals themselves: a burst or a change of prompt lengths
shows here seconds before the requests it brings end and show in the latencies."""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SHIFT_S = 5.0  # the latest arrivals, compared with those before them
FACTOR = 2.0  # a rate or a mean prompt length at least this many times, or this much less
SIGMAS = 4.0  # and this many standard errors apart: a tick every 2 s tests often
MIN_ARRIVALS = 3  # arrivals each side needs before its mean prompt length is compared

Arrival = tuple[float, int]  # (arrival time, prompt length)
# the attribution causes (tuning.attribution.causes) a shift brings before its requests end and show
# them: more arrivals queue for slots and budget; longer prompts put long prefill chunks in
# the decode steps
MORE_ARRIVALS = ("queue_slots", "queue_budget")
LONGER_PROMPTS = ("decode_tax",)


@dataclass(frozen=True)
class Shift:
    """A shift in words, and the causes it brings (most likely first)."""

    text: str
    causes: tuple[str, ...]


def shift(arrivals: Sequence[Arrival], t: float, since: float) -> Shift | None:
    """How the arrivals of the last SHIFT_S before `t` differ from those between `since` and
    them; None when they do not clearly differ or the earlier span is shorter than SHIFT_S.
    Clearly: a rate or mean prompt length FACTOR times higher or lower, and more than SIGMAS
    standard errors apart (Poisson counts for the rates, the earlier prompts' spread for the
    means)."""
    cut = t - SHIFT_S
    span = cut - since
    if span < SHIFT_S:
        return None
    before = [p for a, p in arrivals if since <= a < cut]
    latest = [p for a, p in arrivals if cut <= a <= t]
    rate_before, rate_now = len(before) / span, len(latest) / SHIFT_S
    out: list[str] = []
    causes: tuple[str, ...] = ()
    # two Poisson counts: the rates' difference in standard errors under one pooled rate
    pooled = max(len(before) + len(latest), 1) / (span + SHIFT_S)
    error = math.sqrt(pooled * (1 / span + 1 / SHIFT_S))
    if _apart(rate_now, rate_before) and abs(rate_now - rate_before) > SIGMAS * error:
        out.append(f"arrivals {rate_before:.1f} → {rate_now:.1f} req/s")
        causes += MORE_ARRIVALS if rate_now > rate_before else ()
    # a rate that shifted is a shift already: then even one or two of the latest prompts
    # may say what it brings (one long prompt among short ones, alone, is no shift)
    prompts = _prompts(before, latest, 1 if out else MIN_ARRIVALS)
    if prompts is not None:
        out.append(prompts.text)
        causes += prompts.causes
    return Shift(", ".join(out), causes) if out else None


def longer_since(
    arrivals: Sequence[Arrival], t: float, seen: Shift, seen_t: float, since: float
) -> Shift | None:
    """`seen` (at `seen_t`, against the arrivals from `since`) with the longer prompts that
    arrived after it, up to `t`, when it did not name them: a shift seen on the rate while
    its SHIFT_S straddled the change mixed the old prompts with the new. None when `seen`
    named them already or the prompts since are not clearly longer than those before it."""
    if set(LONGER_PROMPTS) <= set(seen.causes):
        return None
    before = [p for a, p in arrivals if since <= a < seen_t - SHIFT_S]
    after = [p for a, p in arrivals if seen_t < a <= t]
    prompts = _prompts(before, after, 1)  # the shift is seen: one prompt may tell
    if prompts is None or not prompts.causes:
        return None
    return Shift(f"{seen.text}, then {prompts.text}", seen.causes + prompts.causes)


def _prompts(before: list[int], latest: list[int], need: int) -> Shift | None:
    """The mean prompt length of `latest` against `before`'s, if clearly apart (SIGMAS of
    `before`'s spread over `latest`'s count), with MIN_ARRIVALS of `before` and `need` of
    `latest` at least."""
    if len(before) < MIN_ARRIVALS or len(latest) < need:
        return None
    mean_before, mean_now = statistics.fmean(before), statistics.fmean(latest)
    error = statistics.stdev(before) / math.sqrt(len(latest))
    if not (_apart(mean_now, mean_before) and abs(mean_now - mean_before) > SIGMAS * error):
        return None
    causes = LONGER_PROMPTS if mean_now > mean_before else ()
    return Shift(f"mean prompt {mean_before:.0f} → {mean_now:.0f} tokens", causes)


def _apart(now: float, before: float) -> bool:
    return now >= FACTOR * before or now * FACTOR <= before
