"""Token sampling on the logits' device: greedy, temperature, top-k, top-p, per-request seeds,
top-N logprobs. What each row needs is fixed on the engine thread (`SampleSpec`); the sampling
itself runs where the forward pass ran and leaves tensors there, to come back to the host in
the step's one copy."""

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass
class Sampled:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


@dataclass
class SampleSpec:
    """How to sample each row of a step's logits."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]  # None for greedy rows
    logprob_rows: list[int]  # rows that asked for logprobs
    num_logprobs: int  # the most any of them asked for

    @property
    def all_greedy(self) -> bool:
        return all(g is None for g in self.generators)


@dataclass
class DeviceSample:
    """The sampled tokens [rows] and, for `logprob_rows`, the chosen token's log-probability
    [n] and the top `num_logprobs` ids and log-probabilities [n, k], on the logits' device."""

    tokens: torch.Tensor
    chosen_logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


class Sampler:
    """Keeps one random generator per seeded request so its samples are reproducible."""

    def __init__(self, seed: int, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.generator
        gen = self.request_generators.get(request_id)
        if gen is None:
            gen = torch.Generator(self.device).manual_seed(params.seed)
            self.request_generators[request_id] = gen
        return gen

    def spec(self, request_ids: list[str], params: list[SamplingParams]) -> SampleSpec:
        """What sampling these rows needs (engine thread: it looks up generators)."""
        gens = [
            None if p.greedy else self._generator(rid, p)
            for rid, p in zip(request_ids, params, strict=True)
        ]
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        most = max((params[i].logprobs or 0 for i in wanted), default=0)
        return SampleSpec(params, gens, wanted, most)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> Sampled:
        """logits [B, V] float32 -> one token per row, on the host."""
        spec = self.spec(request_ids, params)
        out = sample_on_device(logits, spec)
        return to_host(
            spec,
            out.tokens.tolist(),
            out.chosen_logprobs.tolist(),
            out.top_ids.tolist(),
            out.top_logprobs.tolist(),
        )


def sample_on_device(logits: torch.Tensor, spec: SampleSpec) -> DeviceSample:
    """Sample every row where the logits are; no copy to the host."""
    tokens = logits.argmax(dim=-1)
    if not spec.all_greedy:
        for i, gen in enumerate(spec.generators):
            if gen is not None:
                tokens[i : i + 1] = _sample_row(logits[i], spec.params[i], gen)
    rows = spec.logprob_rows
    if not rows:
        empty = logits.new_empty(0)
        return DeviceSample(tokens, empty, tokens.new_empty(0, 0), logits.new_empty(0, 0))
    index = torch.tensor(rows, device=logits.device)
    lp = torch.log_softmax(logits[index], dim=-1)
    chosen = lp.gather(1, tokens[index].unsqueeze(1)).squeeze(1)
    if spec.num_logprobs:
        values, ids = lp.topk(spec.num_logprobs)
    else:
        values, ids = lp.new_empty(len(rows), 0), tokens.new_empty(len(rows), 0)
    return DeviceSample(tokens, chosen, ids, values)


def to_host(
    spec: SampleSpec,
    tokens: list[int],
    chosen: list[float],
    top_ids: list[list[int]],
    top_values: list[list[float]],
) -> Sampled:
    """The sampled rows as plain values: the chosen token's log-probability first, then each
    row's own top N."""
    logprobs: list[dict[int, float] | None] = [None] * len(tokens)
    for j, i in enumerate(spec.logprob_rows):
        n = spec.params[i].logprobs or 0
        out = {tokens[i]: chosen[j]}
        out.update(zip(top_ids[j][:n], top_values[j][:n], strict=True))
        logprobs[i] = out
    return Sampled(tokens, logprobs)


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> torch.Tensor:
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
    return torch.multinomial(probs, 1, generator=gen)


def top_logprobs(lp: torch.Tensor, n: int, chosen: int) -> dict[int, float]:
    """The n most likely tokens and the chosen one, with their log-probabilities."""
    out = {chosen: float(lp[chosen])}
    if n:
        values, ids = lp.topk(n)
        out.update(zip(ids.tolist(), values.tolist(), strict=True))
    return out
