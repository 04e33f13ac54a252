"""Side-by-side session summaries for the Compare page; pure functions, no I/O.

`summarize` takes what the server returns for one session (GET /api/sessions/{id}, its
steps and its requests) and `delta_rows` lines two summaries up with B - A and B / A.
"""

import math
from collections.abc import Sequence
from typing import Any

from stats import percentile, tpot_span

Record = dict[str, Any]

# (key, label, lower is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("output_tok_s", "throughput (output tokens/s)", False),
    ("total_tok_s", "throughput (prompt + output tokens/s)", False),
    ("ttft_p50_ms", "TTFT p50 ms", True),
    ("ttft_p99_ms", "TTFT p99 ms", True),
    ("tpot_p50_ms", "TPOT p50 ms", True),
    ("tpot_p99_ms", "TPOT p99 ms", True),
    ("preemptions", "preemptions", True),
    ("imbalance", "mean per-layer imbalance (max/mean)", True),
    ("mean_step_ms", "mean step ms", True),
    ("requests", "requests", False),
    ("steps", "steps", False),
)


def tpot_ms(req: Record) -> float | None:
    """A request record's TPOT (`stats.tpot_span`): its first token at TTFT, its last at E2E."""
    if req.get("ttft_ms") is None:
        return None
    return tpot_span(req["ttft_ms"], req["e2e_ms"], req.get("output_len", 0))


def layer_imbalance(steps: Sequence[Record]) -> list[float]:
    """Per layer: max/mean expert load averaged over the steps that routed tokens."""
    sums: list[float] = []
    counts: list[int] = []
    for s in steps:
        for layer, loads in enumerate(s["experts"]["counts"]):
            if layer >= len(sums):
                sums.append(0.0)
                counts.append(0)
            mean = sum(loads) / len(loads) if loads else 0
            if mean:
                sums[layer] += max(loads) / mean
                counts[layer] += 1
    return [total / n if n else math.nan for total, n in zip(sums, counts, strict=True)]


def summarize(session: Record, steps: Sequence[Record], requests: Sequence[Record]) -> Record:
    """The Compare page's numbers for one session.

    Throughput is tokens over the requests' span (first arrival to last finish); TTFT and
    TPOT percentiles (`stats.percentile`) are over requests; preemptions are summed over
    requests; imbalance is the mean over layers of `layer_imbalance`; mean step ms is the
    server's (every step) when present, else the mean of the given steps' `dur_ms.total`.
    """
    span = (
        max(r["finished_t"] for r in requests) - min(r["arrival"] for r in requests)
        if requests
        else 0.0
    )
    out_tok = sum(r["output_len"] for r in requests)
    all_tok = out_tok + sum(r["prompt_len"] for r in requests)
    ttft = [r["ttft_ms"] for r in requests if r.get("ttft_ms") is not None]
    tpot = [t for t in (tpot_ms(r) for r in requests) if t is not None]
    layers = layer_imbalance(steps)
    finite = [x for x in layers if not math.isnan(x)]
    mean_step = session.get("mean_step_ms")
    if mean_step is None and steps:
        mean_step = sum(s["dur_ms"]["total"] for s in steps) / len(steps)
    return {
        "id": session.get("id"),
        "label": session.get("label"),
        "kind": session.get("kind"),
        "steps": session.get("steps", len(steps)),
        "requests": len(requests),
        "span_s": span,
        "output_tok_s": out_tok / span if span > 0 else None,
        "total_tok_s": all_tok / span if span > 0 else None,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "tpot_p50_ms": percentile(tpot, 50),
        "tpot_p99_ms": percentile(tpot, 99),
        "preemptions": sum(r.get("preemptions", 0) for r in requests),
        "layer_imbalance": layers,
        "imbalance": sum(finite) / len(finite) if finite else None,
        "mean_step_ms": mean_step,
    }


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return str(x)
    return f"{x:,.2f}"


def delta_rows(a: Record, b: Record) -> list[dict[str, str]]:
    """One row a metric: A, B, B - A, B / A and which side is better ("A", "B" or "=")."""
    rows = []
    for key, label, lower_better in METRICS:
        x, y = a.get(key), b.get(key)
        diff = ratio = better = "–"
        if x is not None and y is not None:
            diff = f"{y - x:+,.2f}" if isinstance(y - x, float) else f"{y - x:+d}"
            ratio = f"{y / x:.3f}x" if x else "–"
            better = "=" if x == y else ("B" if (y < x) == lower_better else "A")
        rows.append(
            {
                "metric": label,
                "A": _fmt(x),
                "B": _fmt(y),
                "B − A": diff,
                "B / A": ratio,
                "better": better,
            }
        )
    return rows
