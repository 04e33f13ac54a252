"""Choosing each token's experts: softmax top-k (Mixtral, Qwen, OLMoE) and DeepSeek's
group-limited routing (V2 softmax `greedy` / `group_limited_greedy`, V3 sigmoid `noaux_tc`)."""

import torch

from engine.config import ModelConfig


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing: (weights [T, k] float32, expert ids [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def route_grouped(
    logits: torch.Tensor, cfg: ModelConfig, correction: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """DeepSeek routing: (weights [T, k] float32, expert ids [T, k], chosen groups [T, G] as
    0/1, or None without groups).

    Experts fall into `n_group` groups; a token picks `topk_group` groups by their score (V2:
    the best expert's; V3: the sum of the best two, selection scores including the
    `e_score_correction_bias`), then its top-k experts inside them. The bias chooses only: the
    weights are the unbiased scores, renormalised (`norm_topk_prob`) and scaled by
    `routed_scaling_factor`.
    """
    logits = logits.float()
    sigmoid = cfg.topk_method == "noaux_tc"
    scores = logits.sigmoid() if sigmoid else logits.softmax(dim=-1)
    choice = scores if correction is None else scores + correction.float()
    chosen = None
    if cfg.topk_method != "greedy":
        per_group = choice.view(choice.shape[0], cfg.n_group, -1)
        group_score = per_group.topk(2, dim=-1).values.sum(-1) if sigmoid else per_group.amax(-1)
        picked = group_score.topk(cfg.topk_group, dim=-1, sorted=False).indices
        chosen = torch.zeros_like(group_score).scatter_(1, picked, 1.0)
        allowed = chosen.bool().repeat_interleave(per_group.shape[-1], dim=1)
        # V2 zeroes the other groups' (non-negative) scores, V3 excludes them outright
        choice = choice.masked_fill(~allowed, float("-inf") if sigmoid else 0.0)
    experts = choice.topk(cfg.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, experts, chosen
