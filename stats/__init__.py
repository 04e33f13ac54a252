"""Latency statistics, one definition each: percentiles, TPOT, SLO attainment and goodput.

Everything in moescope that reports these (the command line, the sessions API, the
dashboard, the benchmarks, the decision layer) calls this module, so one run shows one p99
wherever it is read. It imports only the standard library, so every layer may use it, the
dashboard included.
"""

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

QUANTILES = (50, 90, 99)  # the percentiles a summary reports


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0 <= q <= 100) of `values`; None when there are no values.

    Linear interpolation between the closest ranks (numpy's default, `method="linear"`): with
    the n values sorted and counted from 0, the value at position (n - 1) * q / 100, where a
    fractional position lies on the straight line between its two neighbours. So p0 is the
    minimum, p100 the maximum and p50 the median (the mean of the middle two for even n); the
    result equals `numpy.percentile(values, q)`.
    """
    ranked = sorted(values)
    return ranked_percentile(ranked, q) if ranked else None


def ranked_percentile(ranked: Sequence[float], q: float) -> float:
    """`percentile` of values already sorted ascending, at least one (O(1), for windows kept
    sorted as values come and go)."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    pos = (len(ranked) - 1) * (q / 100)
    lo = math.floor(pos)
    a, b = ranked[lo], ranked[min(lo + 1, len(ranked) - 1)]
    t = pos - lo
    # interpolated from the nearer neighbour, as numpy does, so that the results agree exactly
    return a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t)


def summary(values: Iterable[float]) -> dict[str, float | None]:
    """`count`, `mean` and the `percentile`s p50, p90 and p99 of `values`; with no values the
    count is 0 and the others are None."""
    ranked = sorted(values)
    out: dict[str, float | None] = {
        "count": len(ranked),
        "mean": statistics.fmean(ranked) if ranked else None,
    }
    for q in QUANTILES:
        out[f"p{q}"] = ranked_percentile(ranked, q) if ranked else None
    return out


def tpot(token_times: Sequence[float]) -> float | None:
    """Time per output token of one request, from the times its output tokens arrived (one
    clock, any unit): see `tpot_span`."""
    return tpot_span(token_times[0], token_times[-1], len(token_times)) if token_times else None


def tpot_span(first: float, last: float, tokens: int) -> float | None:
    """Time per output token: (last - first) / (tokens - 1), the mean time between a request's
    output tokens after the first, from the times of its first and last output tokens and how
    many it produced. The wait for the first token is TTFT's, so TPOT measures decoding
    alone. None for fewer than 2 tokens, which have no time between tokens."""
    return (last - first) / (tokens - 1) if tokens > 1 else None


@dataclass(frozen=True)
class SLO:
    """Per-request latency targets: TTFT at most `ttft` and TPOT at most `tpot`, in the unit
    of the latencies they are checked against."""

    ttft: float
    tpot: float

    def met(self, ttft: float | None, tpot: float | None) -> bool:
        """Whether a request with this TTFT and TPOT meets both targets (a bound is met with
        equality). No TTFT (the request failed or was cut off before its first token) misses;
        no TPOT (a single output token) is judged on TTFT alone."""
        return ttft is not None and ttft <= self.ttft and (tpot is None or tpot <= self.tpot)


def slo_attainment(requests: Iterable[tuple[float | None, float | None]], slo: SLO) -> float | None:
    """The share (0 to 1) of `requests`, each its (TTFT, TPOT), that meet `slo` (`SLO.met`);
    failed requests belong in `requests` and count as misses. None when there are none."""
    met = [slo.met(ttft, tpot) for ttft, tpot in requests]
    return sum(met) / len(met) if met else None


def goodput(
    requests: Iterable[tuple[float | None, float | None]], slo: SLO, duration_s: float
) -> float | None:
    """Requests per second served within the SLO: how many of `requests`, each its (TTFT,
    TPOT), meet `slo` (`SLO.met`), divided by `duration_s`, the wall time over which they
    were sent and served. None when `duration_s` is not positive."""
    if duration_s <= 0:
        return None
    return sum(slo.met(ttft, tpot) for ttft, tpot in requests) / duration_s
