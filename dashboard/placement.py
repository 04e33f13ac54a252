"""The Live page's sidebar map of expert placement (GET /api/experts), drawn by the server: a
pure function of the server's answer to a Plotly figure."""

from typing import Any

import plotly.graph_objects as go

HEIGHT_PER_LAYER = 25  # pixels a layer's row takes


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
        y=info.get("moe_layers") or list(range(len(hosts))),  # MoE layers by real index
        z=z,
        text=text,
        texttemplate="%{text}",
        colorscale="Viridis",
        zmin=0,
        zmax=max(info["ep_size"] - 1, 1),
        colorbar={"title": {"text": "rank"}, "dtick": 1, "thickness": 10},
        hovertemplate="layer %{y}, expert %{x}: rank %{z} %{text}<extra></extra>",
    )
    layout = {
        "title": {"text": f"Placement v{info['version']} ({info['mode']})"},
        "height": 90 + HEIGHT_PER_LAYER * max(len(hosts), 4),
        "margin": {"l": 40, "r": 10, "t": 40, "b": 40},
        "legend": {"orientation": "h", "y": -0.25},
        "xaxis": {"title": {"text": "expert"}, "dtick": 1},
        "yaxis": {"title": {"text": "layer"}, "type": "category"},
    }
    return go.Figure(data=[heat], layout=layout)
