"""The twin on the page: a preview's predicted medians, bands and deltas, the saturation in
words, and the scorecard of applied changes, as plain tables and the rows the browser draws
the bands from (live_charts_web/bands.js); the numbers come from the server."""

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


def band_of(side: dict[str, Any], key: str) -> list[Any]:
    """[low, high] of a side's metric (both None when the answer has no band)."""
    return list((side.get("bands") or {}).get(key) or [None, None])


def banded_text(side: dict[str, Any], key: str) -> str:
    """`120 [95 – 160]`: the median and its 80% band, or the median alone."""
    low, high = band_of(side, key)
    text = _num(side.get(key))
    return text if low is None or high is None else f"{text} [{_num(low)} – {_num(high)}]"


def preview_rows(answer: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of the preview table: metric, now and with the change (median [80% band]), and
    the change of the medians (▲ better)."""
    now, then = answer["current"], answer["candidate"]
    return [
        {
            "metric": label,
            "now": banded_text(now, key),
            "with the change": banded_text(then, key),
            "change": delta_text(now.get(key), then.get(key), lower),
        }
        for key, label, lower in METRICS
    ]


def band_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """What the browser draws the bands from: per metric, [median, low, high] now and with
    the change."""
    now, then = answer["current"], answer["candidate"]
    return [
        {
            "metric": key,
            "label": label,
            "now": [now.get(key), *band_of(now, key)],
            "then": [then.get(key), *band_of(then, key)],
        }
        for key, label, _ in METRICS
    ]


def saturation_lines(answer: dict[str, Any]) -> list[str]:
    """How close each side runs to capacity, in words ("within the noise of saturation: the
    queue builds in 4 of 10 simulations")."""
    return [
        f"{name}: {sat['text']}"
        for name, side in (("now", answer["current"]), ("with the change", answer["candidate"]))
        if (sat := side.get("saturation"))
    ]


def preview_caption(answer: dict[str, Any]) -> str:
    fit = answer["fit"]
    return (
        f"predicted by the twin over {answer.get('horizon_s', '?')} s "
        f"({answer.get('requests', '?')} requests, {answer.get('draws', 1)} simulations a "
        f"side: median [80% band]); step-cost fit error {fit['mape']:.0%} on {fit['steps']} "
        "held-out-checked steps"
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
