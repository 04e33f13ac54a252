"""Per-step forward context: attention layout of the flat batch and MoE statistics."""

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillSeq:
    """A sequence contributing q_len > 1 (or a first) tokens at rows [q_start, q_start+q_len)."""

    q_start: int
    q_len: int
    ctx_len: int
    block_table: torch.Tensor


@dataclass
class DecodeGroup:
    """Sequences with one query row each and similar context lengths, attended together."""

    rows: torch.Tensor
    block_tables: torch.Tensor
    ctx_lens: torch.Tensor


@dataclass
class ForwardContext:
    """How the flat batch maps onto sequences and the KV cache, plus what MoE layers record."""

    slot_mapping: torch.Tensor
    prefills: list[PrefillSeq]
    decodes: list[DecodeGroup]
    token_rank: torch.Tensor
    ep_size: int = 1
    expert_capacity_factor: float | None = None
    expert_counts: list[torch.Tensor] = field(default_factory=list)
    expert_dropped: list[torch.Tensor] = field(default_factory=list)
    moe_seconds: float = 0.0
