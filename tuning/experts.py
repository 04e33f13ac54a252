"""Expert loads for simulated steps, drawn from the routing a recording saw."""

from typing import Any

import numpy as np


class ExpertDraw:
    """Per step: a recorded step's per-layer expert shares, and the pairs routed by them.

    Each draw picks one recorded busy step at random and spreads the simulated step's
    tokens x top_k pairs over the experts of each layer multinomially by that step's shares,
    so uneven popularity and its step-to-step variation carry over."""

    def __init__(self, steps: list[dict[str, Any]], seed: int = 0) -> None:
        profiles = []
        for step in steps:
            counts = np.asarray(step["experts"]["counts"], dtype=np.float64)
            totals = counts.sum(axis=1, keepdims=True)
            if counts.size and (totals > 0).all():
                profiles.append(counts / totals)
        if not profiles:
            raise ValueError("no recorded step routed any token")
        self.profiles = np.stack(profiles)
        self.top_k = int(steps[0]["experts"]["top_k"])
        self.rng = np.random.default_rng(seed)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, experts)."""
        return self.profiles.shape[1], self.profiles.shape[2]

    def draw(self, tokens: int) -> np.ndarray:
        """Routed pairs [layers, experts] for a step of `tokens` tokens."""
        profile = self.profiles[self.rng.integers(len(self.profiles))]
        return self.rng.multinomial(tokens * self.top_k, profile)
