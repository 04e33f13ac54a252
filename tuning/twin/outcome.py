"""What a run delivered, computed one way for a simulated run and a recorded one: throughput,
TTFT and TPOT percentiles, peak KV use, preemptions, queue length at the end and the expert
drop rate; and from its per-request latencies, goodput and SLO attainment against an SLO."""

from dataclasses import dataclass
from typing import Any

import stats

METRICS = (
    "throughput_tok_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "tpot_p99_ms",
    "peak_kv_blocks",
    "preemptions",
    "queue_at_end",
    "drop_rate",
)


@dataclass(frozen=True)
class StepTotals:
    """Step-level totals of a run."""

    peak_kv_blocks: int
    preemptions: int
    queue_at_end: int
    routed_pairs: int
    dropped_pairs: int


@dataclass(frozen=True)
class StepCounts:
    """What one recorded step adds to its run's StepTotals (small enough to keep for every step
    of a long window, where whole records are not)."""

    t: float
    kv_used: int
    preempted: int
    waiting: int
    routed_pairs: int
    dropped_pairs: int


def step_counts(step: dict[str, Any]) -> StepCounts:
    """The StepCounts of a recorded StepTelemetry dict."""
    return StepCounts(
        t=step["t"],
        kv_used=step["kv"]["used"],
        preempted=step["queue"]["preempted"],
        waiting=step["queue"]["waiting"],
        routed_pairs=sum(map(sum, step["experts"]["counts"])),
        dropped_pairs=sum(step["experts"]["dropped"]),
    )


def totals(counts: list[StepCounts]) -> StepTotals:
    """Totals of a run's steps, in step order."""
    return StepTotals(
        peak_kv_blocks=max((c.kv_used for c in counts), default=0),
        preemptions=sum(c.preempted for c in counts),
        queue_at_end=counts[-1].waiting if counts else 0,
        routed_pairs=sum(c.routed_pairs for c in counts),
        dropped_pairs=sum(c.dropped_pairs for c in counts),
    )


def step_totals(steps: list[dict[str, Any]]) -> StepTotals:
    """Totals of recorded StepTelemetry dicts."""
    return totals([step_counts(s) for s in steps])


def request_tpot_ms(record: dict[str, Any]) -> float | None:
    """A request's TPOT from its record: first token at TTFT, last at its end (E2E)."""
    if record["ttft_ms"] is None:
        return None
    return stats.tpot_span(record["ttft_ms"], record["e2e_ms"], record["output_len"])


def outcome(records: list[dict[str, Any]], totals: StepTotals) -> dict[str, Any]:
    """METRICS of a run from its RequestRecord dicts and step totals, with each request's
    [TTFT, TPOT] in ms (`latencies_ms`) and the run's span in seconds (`span_s`). Throughput is
    output tokens of the requests that ended over the span, from the first arrival to the
    last end."""
    latencies = [[r["ttft_ms"], request_tpot_ms(r)] for r in records]
    ttft = stats.summary(t for t, _ in latencies if t is not None)
    tpot = stats.summary(t for _, t in latencies if t is not None)
    span = (
        max(r["finished_t"] for r in records) - min(r["arrival"] for r in records)
        if records
        else 0.0
    )
    tokens = sum(r["output_len"] for r in records)
    return {
        "throughput_tok_s": tokens / span if span > 0 else None,
        **{f"ttft_p{q}_ms": ttft[f"p{q}"] for q in stats.QUANTILES},
        **{f"tpot_p{q}_ms": tpot[f"p{q}"] for q in stats.QUANTILES},
        "peak_kv_blocks": totals.peak_kv_blocks,
        "preemptions": totals.preemptions,
        "queue_at_end": totals.queue_at_end,
        "drop_rate": totals.dropped_pairs / totals.routed_pairs if totals.routed_pairs else 0.0,
        "latencies_ms": latencies,
        "span_s": span,
    }


def slo_scores(result: dict[str, Any], slo: stats.SLO) -> dict[str, float | None]:
    """Goodput (`stats.goodput`, requests per second within `slo` over the run's span) and SLO
    attainment (`stats.slo_attainment`) of an `outcome`, with the requests a simulation cut off
    at its end (`cut_ms`) that can be judged already (`judged`)."""
    requests = [(t, p) for t, p in result["latencies_ms"]]
    requests += judged(result.get("cut_ms", []), slo)
    return {
        "goodput_rps": stats.goodput(requests, slo, result["span_s"]),
        "slo_attainment": stats.slo_attainment(requests, slo),
    }


def judged(
    cut: list[list[float | None]], slo: stats.SLO
) -> list[tuple[float | None, float | None]]:
    """(TTFT, TPOT) of the cut-off requests ([TTFT, TPOT so far, wait] in ms each) whose
    outcome is already likely: one with a first token by its TTFT and TPOT so far, one
    without that waited past the TTFT target as a miss. One that may yet meet its TTFT is
    left out: counted as a miss, the requests arriving in the last seconds of a live twin's
    10 s horizon made its attainment 8-10 points low (benchmarks/control/live_twin.py)."""
    out: list[tuple[float | None, float | None]] = []
    for ttft, tpot, waited in cut:
        if ttft is not None:
            out.append((ttft, tpot))
        elif waited is not None and waited > slo.ttft:
            out.append((waited, None))
    return out


def metric_errors(
    predicted: dict[str, Any], observed: dict[str, Any]
) -> dict[str, dict[str, float | None]]:
    """Per metric: the predicted and observed values, their difference, and the difference
    relative to the observed value (None where a value is missing or the observed one is 0)."""
    out = {}
    for name in METRICS:
        p, o = predicted.get(name), observed.get(name)
        error = None if p is None or o is None else p - o
        out[name] = {
            "predicted": p,
            "observed": o,
            "error": error,
            "relative": None if error is None or not o else error / abs(o),
        }
    return out
