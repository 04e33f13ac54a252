"""Expert-parallel experts: send each routed pair to its expert's rank, compute, send back.

Dispatch: this rank's pairs, sorted by (rank, local index), go out with one all_to_all_single
after the per-expert counts are exchanged. Each rank regroups what it received by local expert and
runs one grouped GEMM over its own experts. Combine: results return the same way and are added
to their rows with the router weights. Expert biases (gpt-oss) are kept whole on every rank and
picked for the hosted experts.
"""

import time
from typing import TYPE_CHECKING, Protocol

import torch

from engine.ep.placement import LayerPlacement
from engine.model.context import RankStats
from engine.model.grouping import count, fits_capacity, group_by_expert
from kernels import moe_experts
from kernels.swiglu import ExpertTerms

if TYPE_CHECKING:
    from engine.ep.group import EPGroup


class HostedExperts(Protocol):
    """What dispatch needs of an MoE layer (the model's MoEBlock): named here, so that the
    model imports this module and not the other way round."""

    @property
    def num_experts(self) -> int: ...  # routed experts of the layer, over every rank

    @property
    def w_gate_up(self) -> torch.Tensor: ...  # [hosted, H, 2I]: this rank's experts only

    @property
    def w_down(self) -> torch.Tensor: ...  # [hosted, I, H]

    def expert_terms(self) -> ExpertTerms | None: ...  # biases of every routed expert


def ep_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    block: HostedExperts,
    layer: LayerPlacement,
    first_row: int,
    capacity: int | None,
    group: "EPGroup",
    stats: RankStats,
) -> torch.Tensor:
    """Routed expert output [n, H] for this rank's rows x [n, H] (rows first_row..)."""
    k, num_local = experts.shape[1], layer.num_local
    pairs = _within_capacity(experts, block.num_experts, capacity, group, stats)
    dest, local = layer.destinations(experts, first_row)
    key = (dest * num_local + local).flatten()[pairs]
    order = pairs[torch.sort(key, stable=True).indices]
    send_counts = count(key, group.size * num_local).view(group.size, num_local)
    received_counts = group.exchange_counts(send_counts)
    send, receive = send_counts.sum(1).tolist(), received_counts.sum(1).tolist()
    received = group.all_to_all(x[order // k], send, receive)
    t0 = time.perf_counter()
    y = _local_experts(received, received_counts, block, list(layer.hosted[group.rank]))
    stats.compute_s += time.perf_counter() - t0
    back = group.all_to_all(y, receive, send)
    row_bytes = x.shape[1] * x.element_size()
    for rank in range(group.size):
        if rank != group.rank:
            stats.sent_bytes[rank] += (send[rank] + receive[rank]) * row_bytes
    stats.computed.append(sum(receive))
    scaled = back * weights.flatten()[order].unsqueeze(1).to(back.dtype)
    return torch.zeros_like(x).index_add_(0, order // k, scaled)


def _within_capacity(
    experts: torch.Tensor,
    num_experts: int,
    capacity: int | None,
    group: "EPGroup",
    stats: RankStats,
) -> torch.Tensor:
    """Indices of this rank's pairs that fit their expert's capacity, counted over the whole
    batch in token order (ranks hold consecutive rows), as one process would count them."""
    flat = experts.flatten()
    if capacity is None:
        stats.dropped.append(0)
        return torch.arange(flat.numel(), device=flat.device)
    routed = count(flat, num_experts)
    every = group.gather_stats(routed.double()).long().to(flat.device)
    keep = fits_capacity(flat, routed, capacity, every[: group.rank].sum(0))
    stats.dropped.append(int((~keep).sum()))
    return keep.nonzero().squeeze(1)


def _local_experts(
    received: torch.Tensor, counts: torch.Tensor, block: HostedExperts, hosted_ids: list[int]
) -> torch.Tensor:
    """This rank's experts (global ids `hosted_ids`, in slot order) over the rows it received
    ([sources, local experts] counts), in order."""
    sources, num_local = counts.shape
    local_ids = torch.arange(num_local, device=received.device).repeat(sources)
    local_of_row = local_ids.repeat_interleave(counts.flatten().to(received.device))
    order, kept, _, _ = group_by_expert(local_of_row, num_local, None)
    if received.shape[0] == 0:
        return received
    hosted = block.w_gate_up.shape[0]
    ones = torch.ones(received.shape[0], 1, device=received.device)
    terms = block.expert_terms()
    if terms is not None:
        terms = terms.rows(hosted_ids)
    w_gate_up, w_down = block.w_gate_up, block.w_down
    return moe_experts(received, w_gate_up, w_down, order, kept[:hosted], ones, terms)
