"""Grouping token-expert pairs by expert: counts, capacity and the stable sort."""

import torch


def count(ids: torch.Tensor, size: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """bincount of the kept ids, with a fixed length and no host sync (CUDA-graph safe)."""
    ones = torch.ones_like(ids) if keep is None else keep.to(ids.dtype)
    return torch.zeros(size, dtype=torch.long, device=ids.device).scatter_add_(0, ids, ones)


def expert_capacity(factor: float | None, num_pairs: int, num_experts: int) -> int | None:
    """Pairs each expert may take in a step (None = dropless): ceil(factor * pairs / experts)."""
    return None if factor is None else max(1, int(-(-factor * num_pairs // num_experts)))


def group_by_expert(
    experts: torch.Tensor, num_experts: int, capacity: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort token-expert pairs by expert, keeping token order inside each expert.

    Returns (pair order [N'], tokens per expert after drops [E], routed counts [E], dropped).
    With a capacity, pairs past an expert's capacity in this step are dropped.
    """
    flat = experts.flatten()
    order = torch.sort(flat, stable=True).indices
    routed = count(flat, num_experts)
    if capacity is None:
        return order, routed, routed, torch.zeros((), dtype=torch.long, device=flat.device)
    starts = torch.cumsum(routed, 0) - routed
    rank = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    keep = rank < capacity
    kept = routed.clamp(max=capacity)
    return order[keep], kept, routed, (~keep).sum()
