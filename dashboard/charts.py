"""Plotly figures from telemetry frames (StepTelemetry dicts, oldest first); pure functions."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

Frame = dict[str, Any]
Frames = Sequence[Frame]

STAGES = ("schedule", "prepare", "forward", "sample")
HEIGHT = 300


def _layout(fig: go.Figure, title: str, y_title: str = "", x_title: str = "step") -> go.Figure:
    # No `template`: resolving one costs ~10 ms a figure, and st.plotly_chart applies the
    # Streamlit theme anyway.
    fig.update_layout(title=title, height=HEIGHT, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.25})
    fig.update_xaxes(title_text=x_title)
    if y_title:
        fig.update_yaxes(title_text=y_title)
    return fig


def _steps(frames: Frames) -> list[int]:
    return [f["step"] for f in frames]


def knob_label(changes: dict[str, list[Any]]) -> str:
    """`{"max_num_seqs": [8, 4]}` -> `max_num_seqs 8→4`."""
    return ", ".join(f"{name} {old}→{new}" for name, (old, new) in changes.items())


def add_knob_markers(fig: go.Figure, frames: Frames) -> go.Figure:
    """A dashed vertical line at each step that applied a knob change, labelled with it."""
    for f in frames:
        for change in f.get("knob_changes") or []:
            fig.add_vline(x=f["step"], line_dash="dash", line_color="#d62728",
                          annotation_text=f"v{change['version']}: {knob_label(change['changes'])}",
                          annotation_position="top left", annotation_font_size=10)
    return fig


def batch_heatmap(frames: Frames) -> go.Figure:
    """Slots x steps coloured by request; prefill cells are marked with an outlined square."""
    max_slots = max((f["batch"]["max_slots"] for f in frames), default=0)
    max_slots = max([max_slots, *(s["slot"] + 1 for f in frames for s in f["batch"]["slots"])])
    z = np.full((max_slots, len(frames)), np.nan)
    text = np.full((max_slots, len(frames)), "", dtype=object)
    ids: dict[str, int] = {}
    px: list[int] = []
    py: list[int] = []
    for col, f in enumerate(frames):
        for s in f["batch"]["slots"]:
            z[s["slot"], col] = ids.setdefault(s["req"], len(ids)) % 10
            text[s["slot"], col] = f"{s['req']} {s['phase']} {s['tokens']} tok, ctx {s['ctx']}"
            if s["phase"] == "prefill":
                px.append(f["step"])
                py.append(s["slot"])
    steps = _steps(frames)
    fig = go.Figure(go.Heatmap(x=steps, y=list(range(max_slots)), z=z, text=text,
                               hovertemplate="step %{x} slot %{y}<br>%{text}<extra></extra>",
                               colorscale="Turbo", zmin=0, zmax=9, showscale=False,
                               name="decode"))
    fig.add_trace(go.Scatter(x=px, y=py, mode="markers", name="prefill",
                             marker={"symbol": "square-open", "color": "black", "size": 7},
                             hoverinfo="skip"))
    return add_knob_markers(_layout(fig, "Batch slots (colour = request)", "slot"), frames)


def batch_usage(frames: Frames) -> go.Figure:
    """Slot occupancy and token-budget use, as fractions, over steps."""
    steps = _steps(frames)
    occ = [len(f["batch"]["slots"]) / max(f["batch"]["max_slots"], 1) for f in frames]
    budget = [(f["batch"]["num_prefill_tokens"] + f["batch"]["num_decode_tokens"])
              / max(f["batch"]["token_budget"], 1) for f in frames]
    fig = go.Figure([go.Scatter(x=steps, y=occ, name="slot occupancy", mode="lines"),
                     go.Scatter(x=steps, y=budget, name="token budget use", mode="lines")])
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return add_knob_markers(_layout(fig, "Batch occupancy", "fraction"), frames)


def kv_area(frames: Frames) -> go.Figure:
    """Used / prefix-cached / free blocks stacked, with usable capacity and watermark lines."""
    steps = _steps(frames)
    fig = go.Figure()
    for key, colour in (("used", "#1f77b4"), ("cached", "#2ca02c"), ("free", "#d9d9d9")):
        fig.add_trace(go.Scatter(x=steps, y=[f["kv"][key] for f in frames], name=key,
                                 stackgroup="kv", mode="lines", line={"color": colour}))
    fig.add_trace(go.Scatter(x=steps, y=[f["kv"]["usable"] for f in frames], name="usable",
                             mode="lines", line={"color": "black", "dash": "dot"}))
    fig.add_trace(go.Scatter(x=steps, y=[f["kv"]["usable"] - f["kv"]["watermark_blocks"]
                                         for f in frames],
                             name="watermark", mode="lines", line={"color": "#ff7f0e",
                                                                   "dash": "dash"}))
    return add_knob_markers(_layout(fig, "KV cache blocks", "blocks"), frames)


def expert_heatmaps(frames: Frames, window: int = 100) -> go.Figure:
    """Layer x expert token counts: the latest step and the sum over the last `window` steps."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "latest step", f"last {min(window, len(frames))} steps"))
    if frames:
        latest = np.asarray(frames[-1]["experts"]["counts"])
        rolling = np.sum([f["experts"]["counts"] for f in frames[-window:]], axis=0)
        for col, z in ((1, latest), (2, rolling)):
            fig.add_trace(go.Heatmap(z=z, colorscale="Viridis", showscale=False,
                                     hovertemplate="layer %{y} expert %{x}: %{z}<extra></extra>"),
                          row=1, col=col)
    fig.update_yaxes(title_text="layer", col=1)
    fig.update_yaxes(dtick=1)
    fig.update_xaxes(dtick=1)
    return _layout(fig, "Expert token counts", x_title="expert")


def imbalance(frames: Frames) -> go.Figure:
    """Per-layer max/mean expert load over steps (1 = perfectly balanced), and dropped tokens."""
    steps = _steps(frames)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    layers = frames[0]["experts"]["layers"] if frames else 0
    for layer in range(layers):
        ys: list[float | None] = []
        for f in frames:
            counts = f["experts"]["counts"][layer]
            mean = sum(counts) / len(counts)
            ys.append(max(counts) / mean if mean else None)
        fig.add_trace(go.Scatter(x=steps, y=ys, name=f"layer {layer}", mode="lines"))
    dropped = [sum(f["experts"]["dropped"]) for f in frames]
    if any(dropped):
        fig.add_trace(go.Bar(x=steps, y=dropped, name="dropped tokens", opacity=0.4),
                      secondary_y=True)
    fig.update_yaxes(title_text="max / mean", secondary_y=False)
    return add_knob_markers(_layout(fig, "Expert imbalance"), frames)


def a2a_heatmap(frames: Frames) -> go.Figure:
    """Source x destination rank bytes of the latest step, titled measured or modeled."""
    if not frames:
        return _layout(go.Figure(), "All-to-all bytes", x_title="destination rank")
    a2a = frames[-1]["a2a"]
    fig = go.Figure(go.Heatmap(z=a2a["bytes"], colorscale="Blues",
                               hovertemplate="src %{y} → dst %{x}: %{z} B<extra></extra>"))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    return _layout(fig, f"All-to-all bytes ({a2a['mode']}, ep_size {a2a['ep_size']})",
                   "source rank", "destination rank")


def _percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of sorted, non-empty `xs`."""
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _rolling_percentiles(frames: Frames, key: str, window: int) -> dict[str, list[float | None]]:
    values: list[float] = []
    out: dict[str, list[float | None]] = {"p50": [], "p99": []}
    ranked: list[float] = []
    for f in frames:
        new = f["latency"][key]
        if new:  # re-sort only when the window changed (np.percentile per step is ~10x slower)
            values.extend(new)
            values = values[-window:]
            ranked = sorted(values)
        for name, q in (("p50", 50), ("p99", 99)):
            out[name].append(_percentile(ranked, q) if ranked else None)
    return out


def latency(frames: Frames, window: int = 64) -> go.Figure:
    """TTFT and TPOT p50/p99 over the last `window` finished requests."""
    steps = _steps(frames)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for key, secondary in (("ttft_ms", False), ("tpot_ms", True)):
        for name, ys in _rolling_percentiles(frames, key, window).items():
            fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines", connectgaps=True,
                                     name=f"{key.split('_')[0].upper()} {name}"),
                          secondary_y=secondary)
    fig.update_yaxes(title_text="TTFT ms", secondary_y=False)
    fig.update_yaxes(title_text="TPOT ms", secondary_y=True)
    return add_knob_markers(_layout(fig, "Latency (rolling)"), frames)


def throughput(frames: Frames, window: int = 20) -> go.Figure:
    """Processed and decoded tokens per second over the last `window` steps."""
    steps = _steps(frames)
    total: list[float | None] = []
    decode: list[float | None] = []
    for i in range(len(frames)):
        span = frames[max(0, i - window):i + 1]
        dt = span[-1]["t"] - span[0]["t"]
        body = span[1:]
        dec = sum(f["batch"]["num_decode_tokens"] for f in body)
        tok = dec + sum(f["batch"]["num_prefill_tokens"] for f in body)
        total.append(tok / dt if dt > 0 else None)
        decode.append(dec / dt if dt > 0 else None)
    fig = go.Figure([go.Scatter(x=steps, y=total, name="all tokens/s", mode="lines"),
                     go.Scatter(x=steps, y=decode, name="decode tokens/s", mode="lines")])
    return add_knob_markers(_layout(fig, "Throughput", "tokens/s"), frames)


def step_time(frames: Frames) -> go.Figure:
    """Step time stacked by stage; the MoE part of forward as a separate line."""
    steps = _steps(frames)
    fig = go.Figure([go.Scatter(x=steps, y=[f["dur_ms"][s] for f in frames], name=s,
                                stackgroup="dur", mode="lines") for s in STAGES])
    fig.add_trace(go.Scatter(x=steps, y=[f["dur_ms"]["moe"] for f in frames],
                             name="moe (within forward)", mode="lines",
                             line={"color": "black", "dash": "dot"}))
    return add_knob_markers(_layout(fig, "Step time", "ms"), frames)


def queues(frames: Frames) -> go.Figure:
    """Waiting / running / swapped requests, and preemptions per step."""
    steps = _steps(frames)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for key in ("waiting", "running", "swapped"):
        fig.add_trace(go.Scatter(x=steps, y=[f["queue"][key] for f in frames], name=key,
                                 mode="lines"))
    fig.add_trace(go.Bar(x=steps, y=[f["queue"]["preempted"] for f in frames],
                         name="preempted", marker_color="#d62728", opacity=0.6),
                  secondary_y=True)
    fig.update_yaxes(title_text="requests", secondary_y=False)
    fig.update_yaxes(title_text="preemptions", secondary_y=True, rangemode="tozero")
    fig.update_yaxes(rangemode="tozero", secondary_y=False)
    return add_knob_markers(_layout(fig, "Queues"), frames)


def live_figures(frames: Frames) -> dict[str, go.Figure]:
    """Every live-page figure by panel name."""
    return {"batch": batch_heatmap(frames), "usage": batch_usage(frames), "kv": kv_area(frames),
            "experts": expert_heatmaps(frames), "imbalance": imbalance(frames),
            "a2a": a2a_heatmap(frames), "latency": latency(frames),
            "throughput": throughput(frames), "step_time": step_time(frames),
            "queues": queues(frames)}
