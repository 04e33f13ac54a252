"""The twin on the page: a preview's predicted deltas and the scorecard of applied changes,
as plain tables (the numbers come from the server; nothing is computed here)."""

from typing import Any

METRICS = (
    ("throughput_tok_s", "throughput tok/s", False),
    ("ttft_p50_ms", "TTFT p50 ms", True),
    ("ttft_p90_ms", "TTFT p90 ms", True),
    ("tpot_p50_ms", "TPOT p50 ms", True),
    ("tpot_p90_ms", "TPOT p90 ms", True),
    ("peak_kv_blocks", "peak KV blocks", True),
    ("preemptions", "preemptions", True),
    ("queue_at_end", "queue at horizon", True),
    ("drop_rate", "expert drop rate", True),
)


def _num(value: Any) -> str:
    return "–" if value is None else f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def delta_text(now: float | None, then: float | None, lower_is_better: bool) -> str:
    """`+12%` with an arrow for better or worse, or `–` when either side is missing."""
    if now is None or then is None:
        return "–"
    if now == 0:
        return "0" if then == 0 else "new"
    change = (then - now) / abs(now)
    better = change < 0 if lower_is_better else change > 0
    mark = "" if abs(change) < 0.005 else (" ▲" if better else " ▼")
    return f"{change:+.0%}{mark}"


def preview_rows(answer: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of the preview table: metric, now, with the change, and the change (▲ better)."""
    now, then = answer["current"], answer["candidate"]
    return [
        {
            "metric": label,
            "now": _num(now.get(key)),
            "with the change": _num(then.get(key)),
            "change": delta_text(now.get(key), then.get(key), lower),
        }
        for key, label, lower in METRICS
    ]


def preview_caption(answer: dict[str, Any]) -> str:
    fit = answer["fit"]
    return (
        f"predicted by the twin over {answer.get('horizon_s', '?')} s "
        f"({answer.get('requests', '?')} requests simulated); step-cost fit error "
        f"{fit['mape']:.0%} on {fit['steps']} held-out-checked steps"
    )


def entry_state(entry: dict[str, Any]) -> str:
    """Where a scorecard entry stands: observed, waiting for its horizon, or not predicted."""
    if entry.get("observed") is not None:
        return "observed"
    if entry.get("predicted") is None:
        return entry.get("reason") or "no prediction"
    return f"observing for {entry.get('horizon_s', '?')} s"


def scorecard_rows(entries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per applied change: version, origin, what changed, and predicted vs observed
    p90 TTFT, p90 TPOT and throughput with the error of each (the server's own errors)."""
    rows = []
    for e in entries:
        predicted = (e.get("predicted") or {}).get("candidate") or {}
        errors = e.get("errors") or {}
        observed = e.get("observed") or {}
        row = {
            "version": str(e.get("version", "–")),
            "origin": str(e.get("origin", "–")),
            "change": ", ".join(f"{k} {v[0]}→{v[1]}" for k, v in (e.get("changes") or {}).items()),
        }
        for key, label in (
            ("ttft_p90_ms", "TTFT p90"),
            ("tpot_p90_ms", "TPOT p90"),
            ("throughput_tok_s", "tok/s"),
        ):
            rel = (errors.get(key) or {}).get("relative")
            err = "–" if rel is None else f"{rel:+.0%}"
            row[label] = f"{_num(predicted.get(key))} / {_num(observed.get(key))} ({err})"
        row["state"] = entry_state(e)
        rows.append(row)
    return rows
