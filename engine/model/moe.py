"""The MoE block: route, group tokens by expert, one grouped GEMM per projection, combine."""

import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.ep.moe import ep_experts
from engine.model.context import ForwardContext
from engine.model.grouping import count, expert_capacity, group_by_expert, kept_mask
from kernels import moe_experts


class MLP(nn.Module):
    """A dense SwiGLU MLP (used as the shared expert)."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing: (weights [T, k] float32, expert ids [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


class MoEBlock(nn.Module):
    router_bias: torch.Tensor  # a buffer

    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.index = index
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.num_experts, self.top_k, self.renormalize = e, cfg.top_k, cfg.norm_topk_prob
        self.gate = nn.Linear(h, e, bias=False)
        self.w_gate_up = nn.Parameter(torch.empty(e, h, 2 * i))
        self.w_down = nn.Parameter(torch.empty(e, i, h))
        self.register_buffer("router_bias", torch.zeros(e), persistent=False)
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(h, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        t0 = time.perf_counter()
        timer = ctx.gpu_timer(x.device)
        out = self._local(x, ctx) if ctx.ep is None else self._distributed(x, ctx)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if timer is None:
            ctx.moe_seconds += time.perf_counter() - t0
        else:
            timer.stop()
        return out

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route(self.gate(x) + self.router_bias, self.top_k, self.renormalize)

    def _local(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Every expert in this process; the placement only models where pairs would go."""
        weights, experts = self._route(x)
        cap = expert_capacity(ctx.expert_capacity_factor, experts.numel(), self.num_experts)
        order, per_expert, routed, dropped = group_by_expert(experts, self.num_experts, cap)
        out = moe_experts(x, self.w_gate_up, self.w_down, order, per_expert, weights)
        keep = None if ctx.row_valid is None else ctx.row_valid.repeat_interleave(self.top_k)
        ctx.expert_counts.append(
            routed if keep is None else count(experts.flatten(), self.num_experts, keep)
        )
        computed = keep if cap is None else kept_mask(order, experts.numel())
        ctx.rank_pairs.append(self._rank_pairs(experts, ctx, computed))
        ctx.expert_dropped.append(dropped)
        return out

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
        weights, experts = self._route(x[start:end])
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
