"""The MoE block: route, group tokens by expert, one grouped GEMM per projection, combine."""

import time
from collections.abc import Callable
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.ep.moe import ep_experts
from engine.model.context import ForwardContext
from engine.model.grouping import count, expert_capacity, group_by_expert, kept_mask
from engine.model.routing import route, route_grouped
from kernels import moe_experts
from kernels.swiglu import ExpertTerms


class MLP(nn.Module):
    """A dense SwiGLU MLP (used as the shared expert)."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEBlock(nn.Module):
    router_bias: torch.Tensor  # a buffer

    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.index = index
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.num_experts, self.top_k, self.renormalize = e, cfg.top_k, cfg.norm_topk_prob
        self.gate = nn.Linear(h, e, bias=cfg.gate_bias)
        self.w_gate_up = nn.Parameter(torch.empty(e, h, 2 * i))
        self.w_down = nn.Parameter(torch.empty(e, i, h))
        # gpt-oss: expert biases (kept whole on expert-parallel ranks: they are small), the
        # clamped SwiGLU, and softmax over the top-k logits only
        self.b_gate_up: nn.Parameter | None = None
        self.b_down: nn.Parameter | None = None
        if cfg.expert_bias:
            self.b_gate_up = nn.Parameter(torch.zeros(e, 2 * i))
            self.b_down = nn.Parameter(torch.zeros(e, h))
        self.swiglu = (cfg.swiglu_limit, cfg.swiglu_alpha)
        self.softmax_after_topk = cfg.softmax_after_topk
        self.register_buffer("router_bias", torch.zeros(e), persistent=False)
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(h, cfg.shared_expert_intermediate_size)
            if cfg.shared_expert_gated:
                self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        # DeepSeek: group-limited routing; V3's selection-only bias is a checkpoint tensor
        self.group_routing = cfg if cfg.family in ("deepseek_v2", "deepseek_v3") else None
        self.e_score_correction_bias: nn.Parameter | None = None
        if cfg.topk_method == "noaux_tc":
            self.e_score_correction_bias = nn.Parameter(torch.zeros(e), requires_grad=False)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        t0 = time.perf_counter()
        timer = ctx.gpu_timer(x.device)
        out = self._local(x, ctx) if ctx.ep is None else self._distributed(x, ctx)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        if timer is None:
            ctx.moe_seconds += time.perf_counter() - t0
        else:
            timer.stop()
        return out

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Self:
        """As nn.Module's, but V3's selection bias stays float32 under `.to(dtype)`: in bf16 it
        would move near-ties between experts (DeepSeek keeps it float32 too)."""
        bias = self.e_score_correction_bias
        full = None if bias is None else bias.detach().float()
        out = super()._apply(fn, recurse)
        if full is not None and self.e_score_correction_bias is not None:
            self.e_score_correction_bias.data = full.to(self.e_score_correction_bias.device)
        return out

    def _route(self, x: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        if self.group_routing is not None:  # DeepSeek scores experts in float32
            logits = F.linear(x.float(), self.gate.weight.float()) + self.router_bias.float()
        else:
            logits = self.gate(x) + self.router_bias
        if self.softmax_after_topk:
            top, experts = logits.float().topk(self.top_k, dim=-1)
            return torch.softmax(top, dim=-1), experts
        if self.group_routing is None:
            return route(logits, self.top_k, self.renormalize)
        bias = self.e_score_correction_bias
        weights, experts, groups = route_grouped(logits, self.group_routing, bias)
        if groups is not None:
            keep = ctx.row_valid
            chosen = groups if keep is None else groups * keep[: groups.shape[0], None]
            ctx.group_counts.append(chosen.sum(0).long())
        return weights, experts

    def _local(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Every expert in this process; the placement only models where pairs would go."""
        weights, experts = self._route(x, ctx)
        cap = expert_capacity(ctx.expert_capacity_factor, experts.numel(), self.num_experts)
        order, per_expert, routed, dropped = group_by_expert(experts, self.num_experts, cap)
        terms = self.expert_terms()
        out = moe_experts(x, self.w_gate_up, self.w_down, order, per_expert, weights, terms)
        keep = None if ctx.row_valid is None else ctx.row_valid.repeat_interleave(self.top_k)
        ctx.expert_counts.append(
            routed if keep is None else count(experts.flatten(), self.num_experts, keep)
        )
        computed = keep if cap is None else kept_mask(order, experts.numel())
        ctx.rank_pairs.append(self._rank_pairs(experts, ctx, computed))
        ctx.expert_dropped.append(dropped)
        return out

    def expert_terms(self) -> ExpertTerms | None:
        """Every expert's biases and the clamped SwiGLU (gpt-oss), or None (plain SwiGLU)."""
        limit, alpha = self.swiglu
        if self.b_gate_up is None and self.b_down is None and limit is None:
            return None
        return ExpertTerms(self.b_gate_up, self.b_down, limit, alpha)

    def _rank_pairs(
        self, experts: torch.Tensor, ctx: ForwardContext, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """Pairs computed (real rows, within capacity) per (source rank, computing rank) under
        the placement."""
        if ctx.placement is None or ctx.placement.ep_size == 1:
            return count(torch.zeros_like(experts.flatten()), 1, keep).view(1, 1)
        ep = ctx.placement.ep_size
        dest, _ = ctx.placement.layers[self.index].destinations(experts)
        src = ctx.token_rank.repeat_interleave(self.top_k)
        return count(src * ep + dest, ep * ep, keep).view(ep, ep)

    def _distributed(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Route this rank's share of rows, run them on their experts' ranks, gather all rows."""
        assert ctx.ep is not None and ctx.rank_stats is not None and ctx.placement is not None
        placement, rows = ctx.placement, x.shape[0]
        ranges = [placement.row_range(r, rows) for r in range(ctx.ep.size)]
        start, end = ranges[ctx.ep.rank]
        weights, experts = self._route(x[start:end], ctx)
        cap = expert_capacity(ctx.expert_capacity_factor, rows * self.top_k, self.num_experts)
        own = ep_experts(
            x[start:end],
            weights,
            experts,
            self,
            placement.layers[self.index],
            start,
            cap,
            ctx.ep,
            ctx.rank_stats,
        )
        ctx.expert_counts.append(count(experts.flatten(), self.num_experts))
        sizes = [b - a for a, b in ranges]
        padded = max(sizes) * x.shape[1] * x.element_size()
        for rank in range(ctx.ep.size):
            if rank != ctx.ep.rank:
                ctx.rank_stats.gathered_bytes[rank] += padded
        return ctx.ep.all_gather_rows(own, sizes)
