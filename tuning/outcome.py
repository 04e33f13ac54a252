"""What a run delivered, computed one way for a simulated run and a recorded one: throughput,
TTFT and TPOT percentiles, peak KV use, preemptions, queue length at the end and the expert
drop rate."""

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


def step_totals(steps: list[dict[str, Any]]) -> StepTotals:
    """Totals of recorded StepTelemetry dicts."""
    dropped = sum(sum(s["experts"]["dropped"]) for s in steps)
    routed = sum(sum(map(sum, s["experts"]["counts"])) for s in steps)
    return StepTotals(
        peak_kv_blocks=max((s["kv"]["used"] for s in steps), default=0),
        preemptions=sum(s["queue"]["preempted"] for s in steps),
        queue_at_end=steps[-1]["queue"]["waiting"] if steps else 0,
        routed_pairs=routed,
        dropped_pairs=dropped,
    )


def request_tpot_ms(record: dict[str, Any]) -> float | None:
    """A request's TPOT from its record: first token at TTFT, last at its end (E2E)."""
    if record["ttft_ms"] is None:
        return None
    return stats.tpot_span(record["ttft_ms"], record["e2e_ms"], record["output_len"])


def outcome(records: list[dict[str, Any]], totals: StepTotals) -> dict[str, float | None]:
    """METRICS of a run from its RequestRecord dicts and step totals. Throughput is output
    tokens of the requests that ended over the time from the first arrival to the last end."""
    ttft = stats.summary(r["ttft_ms"] for r in records if r["ttft_ms"] is not None)
    tpot = stats.summary(t for r in records if (t := request_tpot_ms(r)) is not None)
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
    }
