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
    keep = fits_capacity(flat, num_experts, capacity)
    return order[keep[order]], routed.clamp(max=capacity), routed, (~keep).sum()


def fits_capacity(
    flat: torch.Tensor, num_experts: int, capacity: int, earlier: torch.Tensor | None = None
) -> torch.Tensor:
    """Which pairs (in token order) fit their expert's capacity, once `earlier[e]` pairs of
    expert e were taken by rows before these (another rank's share of the batch)."""
    order = torch.sort(flat, stable=True).indices
    routed = count(flat, num_experts)
    starts = torch.cumsum(routed, 0) - routed
    if earlier is not None:
        starts = starts - earlier
    keep = torch.empty_like(flat, dtype=torch.bool)
    keep[order] = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]] < capacity
    return keep


def kept_mask(order: torch.Tensor, num_pairs: int) -> torch.Tensor:
    """The pairs (in token order) that `order`, an order of kept pairs, holds."""
    return torch.zeros(num_pairs, dtype=torch.bool, device=order.device).index_fill_(0, order, True)
