"""Plotly figures from a WindowView (dashboard/window.py) of telemetry frames, and from the
expert placement (GET /api/experts); pure functions."""

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from dashboard.figure import figure, secondary_y, side_by_side
from dashboard.window import STAGES, WindowView, blocks

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


def batch_heatmap(v: WindowView) -> go.Figure:
    """Slots x steps coloured by request; prefill cells are marked with an outlined square."""
    rows = int(
        max(
            v.col("max_slots").max(initial=0),
            max((c.slots.max(initial=-1) + 1 for c in v.slots), default=0),
        )
    )
    z = np.full((rows, len(v)), math.nan)
    text = np.full((rows, len(v)), "", dtype=object)
    px: list[int] = []
    py: list[int] = []
    for col, (step, column) in enumerate(zip(v.steps, v.slots, strict=True)):
        z[column.slots, col] = column.colours
        text[column.slots, col] = column.texts
        px += [int(step)] * len(column.prefill)
        py += column.prefill
    heat = go.Heatmap(
        x=v.steps,
        y=np.arange(rows),
        z=z,
        text=text,
        hovertemplate="step %{x} slot %{y}<br>%{text}<extra></extra>",
        colorscale="Turbo",
        zmin=0,
        zmax=9,
        showscale=False,
        name="decode",
    )
    prefill = go.Scatter(
        x=px,
        y=py,
        mode="markers",
        name="prefill",
        hoverinfo="skip",
        marker={"symbol": "square-open", "color": "black", "size": 7},
    )
    return figure([heat, prefill], "Batch slots (colour = request)", "slot", **_time(v))


def batch_usage(v: WindowView) -> go.Figure:
    """Slot occupancy and token-budget use, as fractions, over steps."""
    return figure(
        _lines(v, {"occupancy": "slot occupancy", "budget": "token budget use"}),
        "Batch occupancy",
        "fraction",
        **_time(v),
        yaxis={"range": [0, 1.05], "tickformat": ".0%"},
    )


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


def kv_blocks(v: WindowView) -> go.Figure:
    """KV blocks per running request: each of the latest step's, and mean / max over steps."""
    latest = blocks(v.latest) if v.latest else []
    bars = go.Bar(
        x=[f"slot {slot}" for slot, _, _, _ in latest],
        y=[n for _, _, n, _ in latest],
        name="blocks",
        customdata=[[req, ctx] for _, req, _, ctx in latest],
        marker_color="#1f77b4",
        hovertemplate="%{customdata[0]}: %{y} blocks, %{customdata[1]} tokens<extra></extra>",
        showlegend=False,
    )
    over_time = [
        *_lines(v, {"blocks.max": "max"}, line={"dash": "dot"}),
        *_lines(v, {"blocks.mean": "mean per request"}),
    ]
    return side_by_side(
        [bars],
        over_time,
        "KV blocks per running request",
        ("latest step", "over steps"),
        ("batch slot", "step"),
        ("blocks", "blocks"),
        **_time(v),
    )


def expert_heatmaps(v: WindowView) -> go.Figure:
    """Layer x expert token counts: the latest step and the sum over the last steps."""
    hover = "layer %{y} expert %{x}: %{z}<extra></extra>"
    latest = (
        []
        if v.latest is None
        else [
            go.Heatmap(
                z=v.latest["experts"]["counts"],
                colorscale="Viridis",
                showscale=False,
                hovertemplate=hover,
            )
        ]
    )
    rolling = (
        []
        if v.expert_sum is None
        else [
            go.Heatmap(z=v.expert_sum, colorscale="Viridis", showscale=False, hovertemplate=hover)
        ]
    )
    return side_by_side(
        latest,
        rolling,
        "Expert token counts",
        ("latest step", f"last {v.expert_steps} steps"),
        ("expert", "expert"),
        ("layer", ""),
        xaxis={"dtick": 1},
        yaxis={"dtick": 1},
        xaxis2={"dtick": 1},
        yaxis2={"dtick": 1},
    )


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


def a2a_heatmap(v: WindowView) -> go.Figure:
    """Source x destination rank bytes of the latest step, titled measured or modeled."""
    if v.latest is None:
        return figure([], "All-to-all bytes", x_title="destination rank")
    a2a = v.latest["a2a"]
    heat = go.Heatmap(
        z=a2a["bytes"],
        colorscale="Blues",
        hovertemplate="src %{y} → dst %{x}: %{z} B<extra></extra>",
    )
    return figure(
        [heat],
        f"All-to-all bytes ({a2a['mode']}, ep_size {a2a['ep_size']})",
        "source rank",
        "destination rank",
        xaxis={"dtick": 1},
        yaxis={"dtick": 1},
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


def a2a_volume(v: WindowView) -> go.Figure:
    """Total all-to-all bytes per step, one line per mode (measured or modeled), and the
    all-gather of MoE outputs dashed beside them."""
    measured = v.col("a2a.measured") > 0
    kinds = [
        (mode, kind)
        for mode, kind in (("measured", measured), ("modeled", ~measured))
        if kind.any()
    ]
    traces = [
        go.Scatter(
            x=v.steps,
            y=np.where(kind, v.col("a2a.total"), math.nan),
            name=f"{mode} bytes",
            **SCATTER,
        )
        for mode, kind in kinds
    ]
    gather = v.col("a2a.gather")
    traces += [
        go.Scatter(
            x=v.steps,
            y=np.where(kind, gather, math.nan),
            name=f"{mode} all-gather",
            line={"dash": "dot"},
            **SCATTER,
        )
        for mode, kind in kinds
        if gather[kind].any()
    ]
    modes = " and ".join(mode for mode, _ in kinds)
    return figure(
        traces, f"All-to-all volume per step ({modes or 'none yet'})", "bytes", **_time(v)
    )


def ranks(v: WindowView) -> go.Figure:
    """Token-expert pairs per expert-parallel rank in the latest step, and max/mean over steps."""
    a2a = v.latest["a2a"] if v.latest else {}
    tokens, moe_ms = a2a.get("rank_tokens") or [], a2a.get("rank_moe_ms") or []
    hover = [f"{ms:.3f} ms MoE" for ms in moe_ms] if len(moe_ms) == len(tokens) else None
    bars = [
        go.Bar(
            x=[f"rank {r}" for r in range(len(tokens))],
            y=tokens,
            name="pairs",
            hovertext=hover,
            marker_color="#9467bd",
            showlegend=False,
        )
    ]
    line = _lines(v, {"rank.imbalance": "max / mean"}, showlegend=False)
    title = "Expert-parallel rank load" + (
        f" (placement v{a2a['placement_version']})" if "placement_version" in a2a else ""
    )
    if not tokens:
        title += ": no per-rank loads in these frames"
    return side_by_side(
        bars,
        line,
        title,
        ("latest step", "imbalance over steps"),
        ("rank", "step"),
        ("token-expert pairs", "max / mean"),
        **_time(v),
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


PANELS = {
    "batch": batch_heatmap,
    "usage": batch_usage,
    "kv": kv_area,
    "kv_blocks": kv_blocks,
    "queues": queues,
    "step_time": step_time,
    "experts": expert_heatmaps,
    "imbalance": imbalance,
    "a2a": a2a_heatmap,
    "a2a_volume": a2a_volume,
    "ranks": ranks,
    "latency": latency,
    "throughput": throughput,
}


def live_figures(v: WindowView) -> dict[str, go.Figure]:
    """Every live-page figure by panel name."""
    return {name: build(v) for name, build in PANELS.items()}
