"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, top-N logprobs."""

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass
class Sampled:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


class Sampler:
    """Keeps one random generator per seeded request so its samples are reproducible."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.generator
        gen = self.request_generators.get(request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(params.seed)
            self.request_generators[request_id] = gen
        return gen

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> Sampled:
        """logits [B, V] float32 -> one token per row."""
        logits = logits.cpu()
        tokens = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if not p.greedy:
                tokens[i] = self._sample_row(logits[i], p, self._generator(request_ids[i], p))
        logprobs: list[dict[int, float] | None] = [None] * len(params)
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        if wanted:
            lp = torch.log_softmax(logits[wanted], dim=-1)
            for row, i in enumerate(wanted):
                logprobs[i] = top_logprobs(lp[row], params[i].logprobs or 0, tokens[i])
        return Sampled(tokens, logprobs)

    @staticmethod
    def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
        row = row / p.temperature
        if p.top_k:
            kth = row.topk(min(p.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
            outside[0] = False  # the most likely token always stays
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=gen))


def top_logprobs(lp: torch.Tensor, n: int, chosen: int) -> dict[int, float]:
    """The n most likely tokens and the chosen one, with their log-probabilities."""
    out = {chosen: float(lp[chosen])}
    if n:
        values, ids = lp.topk(n)
        out.update(zip(ids.tolist(), values.tolist(), strict=True))
    return out
