"""Attribution over many requests: each cause's share of TTFT and TPOT, at the tail and over
time, and the dominant cause in words."""

from typing import Any

import stats
from tuning.attribution.causes import CAUSES, Timeline, attribute

TAIL_Q = 90  # the percentile whose requests the dominant cause is read from


def shares(parts: list[dict[str, float]]) -> dict[str, float]:
    """Each cause's share of the summed time of `parts` (ms by cause), largest first."""
    total = summed(parts)
    whole = sum(total.values())
    if whole <= 0:
        return {}
    return {c: round(v / whole, 4) for c, v in sorted(total.items(), key=lambda x: -x[1])}


def tail(timelines: list[Timeline], metric: str) -> list[Timeline]:
    """The requests at or above the TAIL_Q percentile of `metric` ("ttft" or "tpot")."""
    values = [(t, v) for t in timelines if (v := latency(t, metric)) is not None]
    cut = stats.percentile([v for _, v in values], TAIL_Q)
    return [] if cut is None else [t for t, v in values if v >= cut]


def latency(t: Timeline, metric: str) -> float | None:
    """A request's measured TTFT or TPOT in ms (the `stats` definitions)."""
    if metric == "ttft":
        return t.ttft_ms
    if t.ttft_ms is None:
        return None
    return stats.tpot_span(t.ttft_ms, t.e2e_ms, t.output_len)


def parts(timelines: list[Timeline], metric: str) -> list[dict[str, float]]:
    return [t.ttft if metric == "ttft" else t.tpot for t in timelines]


def dominant(timelines: list[Timeline], metric: str) -> dict[str, Any] | None:
    """The cause with the largest share of the tail requests' `metric`, and a sentence."""
    top = shares(parts(tail(timelines, metric), metric))
    if not top:
        return None
    cause, share = next(iter(top.items()))
    label = "TTFT" if metric == "ttft" else "TPOT"
    return {
        "cause": cause,
        "share": share,
        "text": f"{round(share * 100)}% of p{TAIL_Q} {label} is {CAUSES[cause]}",
    }


def summarize(timelines: list[Timeline]) -> dict[str, Any]:
    """Shares by cause over every request and over the tail, with the dominant causes."""
    return {
        "requests": len(timelines),
        "ttft": shares(parts(timelines, "ttft")),
        "tpot": shares(parts(timelines, "tpot")),
        f"ttft_p{TAIL_Q}": shares(parts(tail(timelines, "ttft"), "ttft")),
        f"tpot_p{TAIL_Q}": shares(parts(tail(timelines, "tpot"), "tpot")),
        "dominant": {m: dominant(timelines, m) for m in ("ttft", "tpot")},
        "causes": CAUSES,
    }


def over_time(timelines: list[Timeline], bucket_s: float) -> list[dict[str, Any]]:
    """Mean ms by cause of TTFT and TPOT of the requests that ended in each `bucket_s` window."""
    buckets: dict[int, list[Timeline]] = {}
    for t in timelines:
        buckets.setdefault(int(t.end // bucket_s), []).append(t)
    return [
        {
            "t0": key * bucket_s,
            "t1": (key + 1) * bucket_s,
            "requests": len(group),
            "ttft": mean_parts(parts(group, "ttft")),
            "tpot": mean_parts(parts(group, "tpot")),
        }
        for key, group in sorted(buckets.items())
    ]


def mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    """Mean ms by cause over the requests (a request without a cause counts 0 for it)."""
    total = summed(parts)
    return {c: round(v / len(parts), 3) for c, v in total.items()} if parts else {}


def summed(parts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for ms in parts:
        for cause, v in ms.items():
            total[cause] = total.get(cause, 0.0) + v
    return total


def report(
    records: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    bucket_s: float,
    recent: int,
) -> dict[str, Any]:
    """What the API serves for a window: `summarize` over the requests that ended in it (every
    RequestRecord in `records`, over `steps`, which must cover their lives), their causes in
    `bucket_s` buckets over time, and the last `recent` timelines (for a waterfall)."""
    timelines = attribute(records, steps)
    latest = sorted(timelines, key=lambda t: t.end)[-recent:] if recent > 0 else []
    return {
        **summarize(timelines),
        "over_time": over_time(timelines, bucket_s),
        "recent": [t.as_dict() for t in latest],
    }
