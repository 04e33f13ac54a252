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
    keep = _place_in_expert(flat, order, routed) < capacity
    return order[keep], routed.clamp(max=capacity), routed, (~keep).sum()


def fits_capacity(
    flat: torch.Tensor, routed: torch.Tensor, capacity: int, earlier: torch.Tensor
) -> torch.Tensor:
    """Which pairs (in token order; `routed` their counts per expert) fit their expert's
    capacity, once `earlier[e]` pairs of expert e were taken by rows before these (another
    rank's share of the batch)."""
    order = torch.sort(flat, stable=True).indices
    place = _place_in_expert(flat, order, routed)
    keep = torch.empty_like(flat, dtype=torch.bool)
    keep[order] = earlier[flat[order]] + place < capacity
    return keep


def _place_in_expert(flat: torch.Tensor, order: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
    """For each pair in `order` (the stable sort of `flat`; `routed` its counts per expert),
    how many pairs of the same expert come before it in token order."""
    starts = torch.cumsum(routed, 0) - routed
    return torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]


def kept_mask(order: torch.Tensor, num_pairs: int) -> torch.Tensor:
    """The pairs (in token order) that `order`, an order of kept pairs, holds."""
    return torch.zeros(num_pairs, dtype=torch.bool, device=order.device).index_fill_(0, order, True)
