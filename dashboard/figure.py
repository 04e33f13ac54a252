"""Plotly figures built in one constructor call from traces and a layout dict.

`go.Figure(data, layout)` validates once; `add_trace`, `update_*`, `make_subplots` and
`add_vline` each walk the figure again and cost milliseconds apiece, which adds up over a
page of panels. Arrays stay numpy (Plotly sends them as binary). The live charts' layouts
are the same in JavaScript (live_charts_web/figure.js).
"""

import re
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

HEIGHT = 300
MARKER = "#d62728"
AUTOPILOT_MARKER = "#9467bd"  # the autopilot's changes, apart from a person's
HOVER_WIDTH = 80  # characters a line of a marker's hover holds (a longer word overflows)
Layout = dict[str, Any]
Markers = Sequence[tuple[int, str, str | None]]  # step, label, reason (window.py)
Span = tuple[float, float] | None  # the x range of a time series (None: let Plotly choose)


def _axis(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, **extra}


def marker_colour(label: str) -> str:
    """The autopilot's markers in their own colour (their label names it: `window.py`)."""
    return AUTOPILOT_MARKER if label.split(":", 1)[0].endswith(" autopilot") else MARKER


def hover_text(reason: str | None) -> str:
    """A knob change's reason as a marker's hover text: its words in lines of at most
    HOVER_WIDTH characters joined by <br> ("" without a reason), its "&" and "<" escaped:
    plotly reads a hover's tags (a reason's "<b" would start one)."""
    lines: list[str] = []
    for word in re.split(r"[ \t\n\r\f\v]+", reason or ""):
        if not word:
            continue
        if lines and len(lines[-1]) + 1 + len(word) <= HOVER_WIDTH:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(line.replace("&", "&amp;").replace("<", "&lt;") for line in lines)


def markers(marks: Markers) -> tuple[list[Layout], list[Layout]]:
    """Dashed vertical lines, each labelled, at the steps of knob changes; a change's reason
    shows when the label is hovered."""
    xref, yref = "x", "y domain"
    shapes = [
        {
            "type": "line",
            "xref": xref,
            "yref": yref,
            "x0": x,
            "x1": x,
            "y0": 0,
            "y1": 1,
            "line": {"dash": "dash", "color": marker_colour(text), "width": 1},
        }
        for x, text, _ in marks
    ]
    notes = [
        {
            "xref": xref,
            "yref": yref,
            "x": x,
            "y": 1,
            "text": text,
            "showarrow": False,
            "xanchor": "right",
            "yanchor": "top",
            "font": {"size": 10, "color": marker_colour(text)},
            "bgcolor": "rgba(255, 255, 255, 0.8)",
            **({"hovertext": hover} if (hover := hover_text(reason)) else {}),
        }
        for x, text, reason in marks
    ]
    return shapes, notes


def _merged(base: Layout, extra: Layout) -> Layout:
    """`base` with `extra`'s keys; dict values (axes) are merged one level down."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = {**out[key], **value} if isinstance(out.get(key), dict) else value
    return out


def _range(span: Span) -> dict[str, Any]:
    """A fixed x range, so that marker labels do not widen the axis (autorange fits them)."""
    return {} if span is None else {"range": list(span)}


def figure(
    traces: Sequence[Any],
    title: str,
    y_title: str = "",
    x_title: str = "step",
    marks: Markers = (),
    span: Span = None,
    **layout: Any,
) -> go.Figure:
    """One panel: `traces` over a shared x axis (over `span`), knob-change `marks`, extra
    `layout` keys."""
    shapes, notes = markers(marks)
    base: Layout = {
        "title": {"text": title},
        "height": HEIGHT,
        "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
        "legend": {"orientation": "h", "y": -0.25},
        "xaxis": _axis(x_title, **_range(span)),
        "yaxis": _axis(y_title),
        "shapes": shapes,
        "annotations": notes,
    }
    return go.Figure(data=list(traces), layout=_merged(base, layout))


def secondary_y(title: str, **extra: Any) -> Layout:
    """The layout of a right-hand y axis (`yaxis2`) over the main plot; traces set yaxis="y2"."""
    return _axis(title, overlaying="y", side="right", **extra)
