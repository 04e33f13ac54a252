"""The autopilot on the page, as pure functions of GET /api/autopilot's answer: its SLO chart
(measured p90 TTFT and TPOT against their target lines, and SLO attainment) and its decisions
as table rows."""

from typing import Any

import plotly.graph_objects as go

TTFT_COLOUR, TPOT_COLOUR, ATTAINMENT_COLOUR = "#1f77b4", "#ff7f0e", "#2ca02c"


def slo_figure(status: dict[str, Any]) -> go.Figure:
    """p90 TTFT and TPOT (ms, left axis) with dashed target lines, attainment (right axis)."""
    history = status.get("history") or []
    settings = status["settings"]
    t0 = history[0]["t"] if history else 0.0
    x = [h["t"] - t0 for h in history]
    lines = [
        go.Scatter(
            x=x,
            y=[h["ttft_p90_ms"] for h in history],
            name="p90 TTFT ms",
            line={"color": TTFT_COLOUR},
        ),
        go.Scatter(
            x=x,
            y=[h["tpot_p90_ms"] for h in history],
            name="p90 TPOT ms",
            line={"color": TPOT_COLOUR},
        ),
        go.Scatter(
            x=x,
            y=[h["attainment"] for h in history],
            name="SLO attainment",
            yaxis="y2",
            line={"color": ATTAINMENT_COLOUR},
        ),
    ]
    targets = [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": v,
            "y1": v,
            "line": {"color": colour, "dash": "dash"},
        }
        for v, colour in (
            (settings["ttft_p90_ms"], TTFT_COLOUR),
            (settings["tpot_p90_ms"], TPOT_COLOUR),
        )
    ]
    return go.Figure(
        lines,
        {
            "title": "SLO: measured p90 against the targets (dashed)",
            "xaxis": {"title": "seconds"},
            "yaxis": {"title": "ms", "type": "log"},
            "yaxis2": {
                "title": "attainment",
                "overlaying": "y",
                "side": "right",
                "range": [0, 1.05],
                "tickformat": ".0%",
            },
            "shapes": targets,
            "height": 300,
            "margin": {"t": 40, "b": 40},
            "legend": {"orientation": "h"},
            "paper_bgcolor": "white",
            "plot_bgcolor": "white",
        },
    )


def decision_rows(status: dict[str, Any], limit: int = 10) -> list[dict[str, str]]:
    """The latest decisions, newest first: what it did, the version, and why."""
    rows = []
    for d in (status.get("decisions") or [])[:limit]:
        changed = ", ".join(f"{k} {a}→{b}" for k, (a, b) in (d.get("changes") or {}).items())
        rows.append(
            {
                "action": d["action"] if not d.get("refused") else f"{d['action']} (refused)",
                "version": "–" if d.get("version") is None else str(d["version"]),
                "change": changed,
                "why": d.get("refused") or d["reason"],
            }
        )
    return rows
