"""Per-step forward context: attention layout of the flat batch and MoE statistics."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.ep.placement import Placement

if TYPE_CHECKING:
    from engine.ep.group import EPGroup


@dataclass
class PrefillSeq:
    """A sequence contributing q_len > 1 (or a first) tokens at rows [q_start, q_start+q_len)."""

    q_start: int
    q_len: int
    ctx_len: int
    block_table: torch.Tensor
    window_table: torch.Tensor | None = None  # the sliding layers' pool's, when it has one


@dataclass
class DecodeGroup:
    """Sequences with one query row each and similar context lengths, attended together."""

    rows: torch.Tensor
    block_tables: torch.Tensor
    ctx_lens: torch.Tensor
    window_tables: torch.Tensor | None = None  # the sliding layers' pool's, when it has one


class GpuTimer:
    """CUDA events around a stretch of kernels; read once the stream has reached `stop`."""

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.start.record()

    def stop(self) -> None:
        self.end.record()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3


@dataclass
class RankStats:
    """What this rank measured in one step's expert-parallel exchange."""

    sent_bytes: list[int]  # to each rank: dispatched rows plus combined results
    gathered_bytes: list[int]  # to each rank: this rank's output rows, all-gathered
    computed: list[int] = field(default_factory=list)  # pairs computed here, per layer
    dropped: list[int] = field(default_factory=list)  # pairs past capacity here, per layer
    compute_s: float = 0.0  # in this rank's grouped GEMMs


@dataclass
class ForwardContext:
    """How the flat batch maps onto sequences and the KV cache, plus what MoE layers record."""

    kv_index: torch.Tensor  # flat KV cache index (block * block_size + offset) per row
    prefills: list[PrefillSeq]
    decodes: list[DecodeGroup]
    token_rank: torch.Tensor
    # the same index in the sliding layers' own pool (engine.window_pool), when it has one
    window_kv_index: torch.Tensor | None = None
    placement: Placement | None = None
    ep: "EPGroup | None" = None  # set when experts are sharded over real ranks
    rank_stats: RankStats | None = None
    expert_capacity_factor: float | None = None
    row_valid: torch.Tensor | None = None  # [T] bool; False for padding rows (decode graphs)
    expert_counts: list[torch.Tensor] = field(default_factory=list)
    expert_dropped: list[torch.Tensor] = field(default_factory=list)
    rank_pairs: list[torch.Tensor] = field(default_factory=list)  # [src, dst] pairs per layer
    group_counts: list[torch.Tensor] = field(default_factory=list)  # [groups] per MoE layer
    moe_seconds: float = 0.0  # host time on the CPU; on CUDA the GPU time in moe_timers
    moe_timers: list[GpuTimer] = field(default_factory=list)

    def gpu_timer(self, device: torch.device) -> GpuTimer | None:
        """A started GpuTimer for kernels on a CUDA device (not while capturing a graph)."""
        if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return None
        self.moe_timers.append(GpuTimer())
        return self.moe_timers[-1]

    def moe_total_seconds(self) -> float:
        """MoE time of the step; call after the device work is done (e.g. a copy to the host)."""
        return self.moe_seconds + sum(t.seconds() for t in self.moe_timers)
