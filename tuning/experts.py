"""Expert loads for simulated steps, drawn from the routing a recording saw."""

from typing import Any

import numpy as np


class ExpertDraw:
    """Routed pairs for simulated steps, by each layer's expert popularity in the recording.

    Each token picks top_k distinct experts per layer, weighted by how often the recording
    routed to each (the Gumbel top-k trick draws k without replacement in one pass). One
    recorded step alone has too few pairs to show an expert's popularity: a decode step of
    six tokens routes twelve pairs, and its shares would make capacity drops look far worse
    than they are."""

    def __init__(self, steps: list[dict[str, Any]], seed: int = 0) -> None:
        counts = [np.asarray(s["experts"]["counts"], dtype=np.float64) for s in steps]
        total = np.sum([c for c in counts if c.size], axis=0)
        if not np.ndim(total) or total.sum() == 0:
            raise ValueError("no recorded step routed any token")
        # an expert never seen keeps a little weight, so that it can still be drawn
        smoothed = total + 0.5
        self.log_p = np.log(smoothed / smoothed.sum(axis=1, keepdims=True))
        self.top_k = int(steps[0]["experts"]["top_k"])
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, experts)."""
        layers, experts = self.log_p.shape
        return layers, experts

    def reseed(self) -> None:
        """Start the draws again, so that runs under different knobs see the same loads."""
        self.rng = np.random.default_rng(self.seed)

    def draw(self, tokens: int) -> np.ndarray:
        """Routed pairs [layers, experts] for a step of `tokens` tokens."""
        layers, experts = self.shape
        keys = self.log_p[:, None, :] + self.rng.gumbel(size=(layers, tokens, experts))
        chosen = np.argpartition(-keys, self.top_k - 1, axis=2)[:, :, : self.top_k]
        out = np.zeros((layers, experts), dtype=np.int64)
        np.add.at(out, (np.arange(layers)[:, None, None], chosen), 1)
        return out
