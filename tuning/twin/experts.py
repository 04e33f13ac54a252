"""Expert loads for simulated steps, taken from the routing the recording saw."""

import bisect
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


class Routing(NamedTuple):
    """The routed pairs of recorded steps that routed any, [steps, layers, experts], and the
    model's top_k: all the twin reads of the steps' routing (a few KB to send to the analysis
    process, where the step records were hundreds)."""

    counts: np.ndarray
    top_k: int


def routed(step: dict[str, Any]) -> np.ndarray | None:
    """A StepTelemetry's routed pairs [layers, experts]; None when it routed none."""
    counts = np.asarray(step["experts"]["counts"], dtype=np.int64)
    return counts if counts.size and counts.sum() else None


def routing(steps: Sequence[dict[str, Any]]) -> Routing:
    """The Routing of StepTelemetry dicts."""
    top_k = int(steps[0]["experts"]["top_k"]) if steps else 0
    return stacked([c for s in steps if (c := routed(s)) is not None], top_k)


def stacked(counts: Sequence[np.ndarray], top_k: int) -> Routing:
    """A Routing of `routed` arrays."""
    return Routing(np.stack(counts) if counts else np.zeros((0, 0, 0), np.int64), top_k)


class ExpertDraw:
    """Routed pairs [layers, experts] for simulated steps, from recorded steps of the same size.

    A step of n tokens gets the counts of a recorded step of n tokens, in recorded order, so
    that a run whose steps have the recording's sizes (a capacity factor changes no scheduling)
    sees exactly the recorded loads and drops. Real loads are far more concentrated than
    independent per-token draws by popularity: tokens of one prompt, and a decoding sequence
    step after step, route alike. A size the recording never ran draws its tokens by the
    shares of the recorded step nearest in size, so that concentration carries over. That
    draw is seeded by the size and the recorded step alone and kept: a run's loads do not
    depend on the runs before it, and the twin's runs under other knobs reuse the draws
    (drawing was half a live twin's CPU)."""

    def __init__(self, routing: Routing, seed: int = 0) -> None:
        self.top_k = routing.top_k
        self.by_size: dict[int, list[np.ndarray]] = {}
        for counts in routing.counts:
            self.by_size.setdefault(int(counts[0].sum()) // self.top_k, []).append(counts)
        if not self.by_size:
            raise ValueError("no recorded step routed any token")
        self.sizes = sorted(self.by_size)
        total = np.sum([c for same in self.by_size.values() for c in same], axis=0)
        self.popularity = total / total.sum(axis=1, keepdims=True)
        self.seed = seed
        self.drawn: dict[tuple[int, int, int], np.ndarray] = {}
        # what the simulator works out from an array handed out (tuning.twin.simulator.Loads), by
        # the array's id (each is kept in by_size or drawn as long as this draw, so no id is
        # reused), the capacity factor and what the traffic depends on (Loads.key)
        self.loads: dict[tuple[Any, ...], Any] = {}
        self.restart()

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, experts)."""
        layers, experts = self.popularity.shape
        return layers, experts

    def restart(self) -> None:
        """Replay the recorded steps from the first again, so that runs under different knobs
        see the same loads."""
        self.used = dict.fromkeys(self.sizes, 0)

    def draw(self, tokens: int) -> np.ndarray:
        """Routed pairs [layers, experts] for a step of `tokens` tokens."""
        if tokens in self.by_size:
            return self.by_size[tokens][self._next(tokens)]
        size = self._nearest(tokens)
        i = self._next(size)
        key = (tokens, size, i)
        if key not in self.drawn:
            rng = np.random.default_rng((self.seed, *key))
            self.drawn[key] = self._sample(tokens, self.by_size[size][i], rng)
        return self.drawn[key]

    def ahead(self, tokens: int, k: int, after: int = 0) -> list[np.ndarray]:
        """What the `k` draws for steps of `tokens` tokens that follow the next `after` will
        give, without drawing any (`skip` draws them)."""
        size = self._size(tokens)
        used = self.used[size]
        self.used[size] += after
        out = [self.draw(tokens) for _ in range(k)]
        self.used[size] = used
        return out

    def skip(self, tokens: int, k: int) -> None:
        """Draw `k` steps of `tokens` tokens, as `draw` would, without handing them out."""
        self.used[self._size(tokens)] += k

    def _size(self, tokens: int) -> int:
        """The recorded size the draws for `tokens` tokens come from."""
        return tokens if tokens in self.by_size else self._nearest(tokens)

    def _next(self, size: int) -> int:
        """The index of the next of the recorded steps of `size` tokens, in recorded order."""
        self.used[size] += 1
        return (self.used[size] - 1) % len(self.by_size[size])

    def _nearest(self, tokens: int) -> int:
        """The recorded size nearest to `tokens` by ratio."""
        i = bisect.bisect(self.sizes, tokens)
        near = [self.sizes[j] for j in (i - 1, i) if 0 <= j < len(self.sizes)]
        return min(near, key=lambda m: abs(np.log(tokens / m)))

    def _sample(self, tokens: int, like: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each token picks top_k distinct experts per layer by `like`'s shares (the Gumbel
        top-k trick draws k without replacement in one pass); a little of the whole
        recording's popularity keeps every expert it saw drawable."""
        shares = like / like.sum(axis=1, keepdims=True)
        log_p = np.log(0.9 * shares + 0.1 * self.popularity + 1e-12)
        layers, experts = self.shape
        keys = log_p[:, None, :] + rng.gumbel(size=(layers, tokens, experts))
        chosen = np.argpartition(-keys, self.top_k - 1, axis=2)[:, :, : self.top_k]
        out = np.zeros((layers, experts), dtype=np.int64)
        np.add.at(out, (np.arange(layers)[:, None, None], chosen), 1)
        return out
