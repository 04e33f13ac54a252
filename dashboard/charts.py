"""Server-drawn Plotly figures: the Compare page's, from a WindowView (dashboard/window.py) of
a recorded session's steps, the same panels the live charts draw in the browser
(live_charts_web/panels.js); and the sidebar's expert placement (GET /api/experts). Pure
functions."""

import math
from typing import Any

import plotly.graph_objects as go

from dashboard.figure import figure, secondary_y
from dashboard.window import STAGES, WindowView

SCATTER = {"mode": "lines"}


def _time(v: WindowView) -> dict[str, Any]:
    """A time series' knob markers and x span (half a step either side of the window)."""
    steps = v.steps
    return {"marks": v.markers, "span": (steps[0] - 0.5, steps[-1] + 0.5) if len(steps) else None}


def _lines(v: WindowView, names: dict[str, str], **extra: object) -> list[go.Scatter]:
    """One line a column; `names` maps column to legend name."""
    return [
        go.Scatter(x=v.steps, y=v.col(col), name=name, **SCATTER, **extra)
        for col, name in names.items()
    ]


def kv_area(v: WindowView) -> go.Figure:
    """Used / prefix-cached / free blocks stacked, with usable capacity and watermark lines."""
    stacked = [
        go.Scatter(
            x=v.steps,
            y=v.col(f"kv.{key}"),
            name=key,
            stackgroup="kv",
            line={"color": colour},
            **SCATTER,
        )
        for key, colour in (("used", "#1f77b4"), ("cached", "#2ca02c"), ("free", "#d9d9d9"))
    ]
    limits = [
        go.Scatter(
            x=v.steps,
            y=v.col("kv.usable"),
            name="usable",
            line={"color": "black", "dash": "dot"},
            **SCATTER,
        ),
        go.Scatter(
            x=v.steps,
            y=v.col("kv.watermark"),
            name="watermark",
            line={"color": "#ff7f0e", "dash": "dash"},
            **SCATTER,
        ),
    ]
    return figure(stacked + limits, "KV cache blocks", "blocks", **_time(v))


def imbalance(v: WindowView) -> go.Figure:
    """Per-layer max/mean expert load over steps (1 = perfectly balanced), and dropped tokens."""
    traces: list[go.Scatter | go.Bar] = [
        go.Scatter(x=v.steps, y=v.imbalance[:, layer], name=f"layer {layer}", **SCATTER)
        for layer in range(v.imbalance.shape[1])
    ]
    dropped = v.col("dropped")
    if not dropped.any():
        return figure(traces, "Expert imbalance", "max / mean", **_time(v))
    traces.append(go.Bar(x=v.steps, y=dropped, name="dropped tokens", opacity=0.4, yaxis="y2"))
    return figure(
        traces,
        "Expert imbalance",
        "max / mean",
        **_time(v),
        yaxis2=secondary_y("dropped tokens", rangemode="tozero"),
    )


def placement_map(info: dict[str, Any]) -> go.Figure:
    """Layer x expert -> hosting rank, from GET /api/experts; replicated experts are marked."""
    hosts: list[list[list[int]]] = []
    for layer in info["placement"]:
        per_expert: dict[int, list[int]] = {}
        for rank, experts in enumerate(layer):
            for expert in experts:
                per_expert.setdefault(expert, []).append(rank)
        hosts.append([sorted(set(per_expert.get(e, []))) for e in range(len(per_expert))])
    z = [[ranks[0] if ranks else None for ranks in layer] for layer in hosts]
    text = [
        ["+".join(map(str, ranks)) if len(ranks) > 1 else "" for ranks in layer] for layer in hosts
    ]
    heat = go.Heatmap(
        z=z,
        text=text,
        texttemplate="%{text}",
        colorscale="Viridis",
        zmin=0,
        zmax=max(info["ep_size"] - 1, 1),
        colorbar={"title": {"text": "rank"}, "dtick": 1, "thickness": 10},
        hovertemplate="layer %{y}, expert %{x}: rank %{z} %{text}<extra></extra>",
    )
    title = f"Placement v{info['version']} ({info['mode']})"
    return figure(
        [heat],
        title,
        "layer",
        "expert",
        height=90 + 25 * max(len(hosts), 4),
        xaxis={"dtick": 1},
        yaxis={"dtick": 1},
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
    )


def latency(v: WindowView) -> go.Figure:
    """TTFT and TPOT p50/p99 over the last finished requests."""
    ttft = _lines(v, {"ttft.p50": "TTFT p50", "ttft.p99": "TTFT p99"}, connectgaps=True)
    tpot = _lines(v, {"tpot.p50": "TPOT p50", "tpot.p99": "TPOT p99"}, connectgaps=True, yaxis="y2")
    return figure(
        ttft + tpot, "Latency (rolling)", "TTFT ms", **_time(v), yaxis2=secondary_y("TPOT ms")
    )


def throughput(v: WindowView) -> go.Figure:
    """Processed and decoded tokens per second over the last steps."""
    return figure(
        _lines(v, {"tok_s": "all tokens/s", "decode_tok_s": "decode tokens/s"}),
        "Throughput",
        "tokens/s",
        **_time(v),
    )


def step_time(v: WindowView) -> go.Figure:
    """Step time stacked by stage; the MoE part of forward as a separate line."""
    stages = [
        go.Scatter(x=v.steps, y=v.col(f"dur.{s}"), name=s, stackgroup="dur", **SCATTER)
        for s in STAGES
        if s != "moe"
    ]
    moe = go.Scatter(
        x=v.steps,
        y=v.col("dur.moe"),
        name="moe (within forward)",
        line={"color": "black", "dash": "dot"},
        **SCATTER,
    )
    return figure([*stages, moe], "Step time", "ms", **_time(v))


def queues(v: WindowView) -> go.Figure:
    """Waiting / running / swapped requests, and preemptions per step."""
    lines = _lines(v, {f"queue.{q}": q for q in ("waiting", "running", "swapped")})
    preempted = v.col("queue.preempted")
    bars = go.Bar(
        x=v.steps, y=preempted, name="preempted", marker_color="#d62728", opacity=0.6, yaxis="y2"
    )
    peak = max(1, int(preempted.max(initial=0)))  # whole preemptions on the right axis
    return figure(
        [*lines, bars],
        "Queues",
        "requests",
        **_time(v),
        yaxis={"rangemode": "tozero"},
        yaxis2=secondary_y(
            "preemptions", range=[0, peak * 1.05], dtick=max(1, math.ceil(peak / 4))
        ),
    )
