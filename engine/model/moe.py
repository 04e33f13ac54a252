"""The MoE block: route, group tokens by expert, one grouped GEMM per projection, combine."""

import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.model.context import ForwardContext
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


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing: (weights [T, k] float32, expert ids [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def count(ids: torch.Tensor, size: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """bincount of the kept ids, with a fixed length and no host sync (CUDA-graph safe)."""
    ones = torch.ones_like(ids) if keep is None else keep.to(ids.dtype)
    return torch.zeros(size, dtype=torch.long, device=ids.device).scatter_add_(0, ids, ones)


def group_by_expert(
    experts: torch.Tensor, num_experts: int, capacity_factor: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort token-expert pairs by expert, keeping token order inside each expert.

    Returns (pair order [N'], tokens per expert after drops [E], routed counts [E], dropped).
    With a capacity factor, pairs past an expert's capacity in this step are dropped.
    """
    flat = experts.flatten()
    order = torch.sort(flat, stable=True).indices
    routed = count(flat, num_experts)
    if capacity_factor is None:
        return order, routed, routed, torch.zeros((), dtype=torch.long, device=flat.device)
    capacity = max(1, int(-(-capacity_factor * flat.numel() // num_experts)))
    starts = torch.cumsum(routed, 0) - routed
    rank = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    keep = rank < capacity
    kept = routed.clamp(max=capacity)
    return order[keep], kept, routed, (~keep).sum()


class MoEBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
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

    def _counts_by_rank(
        self, experts: torch.Tensor, routed: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Token-expert pairs of real rows per (source rank, expert): [ep_size, experts]."""
        ep = ctx.ep_size
        keep = None if ctx.row_valid is None else ctx.row_valid.repeat_interleave(self.top_k)
        if ep == 1 and keep is None:
            return routed.unsqueeze(0)
        src = ctx.token_rank.repeat_interleave(self.top_k)
        pairs = count(src * self.num_experts + experts.flatten(), ep * self.num_experts, keep)
        return pairs.view(ep, self.num_experts)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        t0 = time.perf_counter()
        timer = ctx.gpu_timer(x.device)
        weights, experts = route(self.gate(x) + self.router_bias, self.top_k, self.renormalize)
        order, per_expert, routed, dropped = group_by_expert(
            experts, self.num_experts, ctx.expert_capacity_factor
        )
        out = moe_experts(x, self.w_gate_up, self.w_down, order, per_expert, weights)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        ctx.expert_counts.append(self._counts_by_rank(experts, routed, ctx))
        ctx.expert_dropped.append(dropped)
        if timer is None:
            ctx.moe_seconds += time.perf_counter() - t0
        else:
            timer.stop()
        return out
