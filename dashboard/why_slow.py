"""The "Why slow?" figures from an attribution report (GET /api/attribution or
/api/sessions/{id}/attribution): TTFT and TPOT by cause over time, and a waterfall of the
latest requests by phase; pure functions (every number comes from the server)."""

import math
import time
from typing import Any

import plotly.graph_objects as go

from dashboard.causes import colour, ordered, phase_colour
from dashboard.figure import figure

Report = dict[str, Any]
METRICS = {"ttft": "TTFT", "tpot": "TPOT"}
BARS_HEIGHT = 420  # room below the plot for a legend of long cause names
ROW_PX = 14  # waterfall height per request


def headline(report: Report) -> list[str]:
    """The dominant cause of p90 TTFT and of p90 TPOT, in the server's words."""
    return [d["text"] for d in report.get("dominant", {}).values() if d]


def label(report: Report, cause: str) -> str:
    """A cause in the server's words."""
    return report.get("causes", {}).get(cause, cause)


def origin(report: Report) -> float:
    """The unix time both figures count seconds from: the earliest bucket or arrival shown."""
    starts = [b["t0"] for b in report["over_time"]] + [t["arrival"] for t in report["recent"]]
    return min(starts, default=report.get("from", 0.0))


def _seconds_after(t0: float) -> str:
    return f"s after {time.strftime('%H:%M:%S', time.localtime(t0))}"


def cause_bars(report: Report, metric: str) -> go.Figure:
    """Mean `metric` ("ttft" or "tpot") ms by cause of the requests that ended in each
    bucket, stacked, so that a bar is as high as the bucket's mean."""
    buckets = report["over_time"]
    t0 = origin(report)
    x = [(b["t0"] + b["t1"]) / 2 - t0 for b in buckets]
    width = [b["t1"] - b["t0"] for b in buckets]
    requests = [b["requests"] for b in buckets]
    bars = [
        go.Bar(
            x=x,
            y=[b[metric].get(cause, 0.0) for b in buckets],
            width=width,
            customdata=requests,
            name=label(report, cause),
            marker_color=colour(cause),
            hovertemplate="%{fullData.name}: %{y:.1f} ms (mean of %{customdata} requests)"
            "<extra></extra>",
        )
        for cause in ordered({c for b in buckets for c in b[metric]})
    ]
    name = METRICS[metric]
    return figure(
        bars,
        f"{name} by cause",
        f"mean {name} ms",
        _seconds_after(t0),
        barmode="stack",
        height=BARS_HEIGHT,
    )


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def breakdown(report: Report, timeline: dict[str, Any]) -> str:
    """A request's hover text: its TTFT and TPOT, each split by cause in ms, largest first."""
    t = timeline
    lines = [f"<b>{t['req']}</b>: E2E {_ms(t['e2e_ms'])}, {t['output_len']} tokens"]
    totals = {"ttft": t["ttft_ms"], "tpot": sum(t["tpot"].values()) if t["tpot"] else None}
    for metric, name in METRICS.items():
        lines.append(f"{name} {_ms(totals[metric])}")
        parts = sorted(t[metric].items(), key=lambda kv: -kv[1])
        lines += [f"   {label(report, cause)} {_ms(ms)}" for cause, ms in parts]
    return "<br>".join(lines)


def _phase_name(report: Report, phase: str, cause: str | None) -> str:
    """A wait goes by its cause's words (e.g. "queueing for a slot: ..."), the rest by phase."""
    return label(report, cause) if phase == "waiting" and cause else phase


def runs(phases: list[dict[str, Any]]) -> list[tuple[tuple[str, str | None], float, float]]:
    """A timeline's phases as bars: (phase, a wait's cause) with its start and end, one bar
    for each run of touching phases of the same colour. A decode's steps alternate with the
    loop's overhead between them, both drawn as decode: one bar, not two a step (a waterfall
    of 50 requests was 3 MB of figure, redrawn every few seconds)."""
    out: list[tuple[tuple[str, str | None], float, float]] = []
    for p in phases:
        key = (p["phase"], p["cause"] if p["phase"] == "waiting" else None)
        if out and out[-1][0] == key and math.isclose(out[-1][2], p["t0"], abs_tol=1e-6):
            out[-1] = (key, out[-1][1], p["t1"])
        else:
            out.append((key, p["t0"], p["t1"]))
    return out


def waterfall(report: Report) -> go.Figure:
    """The latest requests, a row each from arrival to end (earliest on top), coloured by
    phase (a wait by its cause); hovering a bar shows its request's breakdown."""
    t0 = origin(report)
    timelines = sorted(report["recent"], key=lambda t: t["arrival"])
    # one trace per colour, so that each shows once in the legend
    groups: dict[tuple[str, str | None], list[tuple[str, float, float, str]]] = {}
    for t in timelines:
        hover = breakdown(report, t)
        for key, start, end in runs(t["phases"]):
            groups.setdefault(key, []).append((t["req"], start - t0, end - start, hover))
    bars = [
        go.Bar(
            orientation="h",
            y=[req for req, _, _, _ in segments],
            base=[start for _, start, _, _ in segments],
            x=[length for _, _, length, _ in segments],
            customdata=[length for _, _, length, _ in segments],  # %{x} would be the bar's end
            hovertext=[hover for _, _, _, hover in segments],
            name=_phase_name(report, phase, cause),
            marker_color=phase_colour(phase, cause),
            hovertemplate="%{fullData.name}: %{customdata:.3f} s<br>%{hovertext}<extra></extra>",
        )
        for (phase, cause), segments in groups.items()
    ]
    rows = [t["req"] for t in timelines]
    return figure(
        bars,
        f"Latest {len(rows)} requests by phase",
        "request",
        _seconds_after(t0),
        barmode="overlay",
        height=max(BARS_HEIGHT, 160 + ROW_PX * len(rows)),
        yaxis={"categoryorder": "array", "categoryarray": rows, "autorange": "reversed"},
    )
