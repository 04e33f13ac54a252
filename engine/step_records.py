"""The records a step passes between its stages: the plan made on the engine thread
(`StepPlan`), its device inputs (`ModelInput`), the forward pass's result and what the compute
thread hands back (`ForwardResult`, `Executed`), and the commands rank 0 sends the other
expert-parallel ranks (`Swap`, `Forward`, `Rebalance`)."""

from dataclasses import dataclass, field

import torch

from engine.ep.placement import Placement
from engine.model.context import ForwardContext
from engine.sampling import Sampled, SampleSpec


@dataclass
class PrefillSpec:
    row: int
    q_len: int
    ctx_len: int
    slot: int
    num_blocks: int


# the int64 segments of a step's one host-to-device copy, in order
SEGMENTS = (
    "ids",
    "positions",
    "row_slots",
    "decode_rows",
    "decode_lens",
    "decode_slots",
    "sample_rows",
    "write_slots",
    "write_cols",
    "write_blocks",
    "fill_rows",
    "fill_from",
)


@dataclass
class StepPlan:
    """A step's batch as host arrays, made on the engine thread while the step before may
    still run; the compute thread turns it into device tensors with one copy. Decode rows are
    sorted by context length (groups of DECODE_GROUP neighbours pad little); rows listed in
    `fill_rows` take the token sampled at row `fill_from` of the step before, still unknown
    when the plan was made."""

    num_rows: int
    packed: torch.Tensor  # SEGMENTS concatenated
    sizes: list[int]
    widths: list[int]  # block-table width of each decode group
    prefills: list[PrefillSpec]
    table_rows: int
    placement: Placement
    capacity_factor: float | None
    sample: SampleSpec
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    # the sliding layers' pool's (engine.window_pool), when the model has one
    window_swap_out: list[tuple[int, int]] = field(default_factory=list)
    window_swap_in: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    ctx: ForwardContext
    sample_rows: torch.Tensor


@dataclass
class MeasuredA2A:
    """What the ranks measured in one step: bytes sent [from][to] by the all-to-alls and by
    the all-gathers, pairs computed per layer and rank [layers, ranks], and each rank's
    grouped-GEMM milliseconds."""

    bytes: list[list[int]]
    gather_bytes: list[list[int]]
    computed: torch.Tensor
    compute_ms: list[float]


@dataclass
class ForwardResult:
    """Logits for the chunks that sample this step, in chunk order, plus MoE statistics: on
    the model's device from `forward`, on the host in `Executed` (the step's one copy)."""

    logits: torch.Tensor
    expert_counts: torch.Tensor  # [layers, experts]
    expert_dropped: torch.Tensor  # [layers]
    moe_seconds: float
    rank_pairs: torch.Tensor | None = None  # [layers, src, dst] as the placement models it
    measured: MeasuredA2A | None = None  # with real expert-parallel ranks
    ctx: ForwardContext | None = None  # its GPU timers are read once the step's copy is back
    group_counts: torch.Tensor | None = None  # [MoE layers, groups] chosen (DeepSeek routing)


@dataclass
class Executed:
    """A step as the compute thread ran it: sampled tokens (on the device too, for the next
    step's inputs), the forward result with its statistics on the host, and when it ran."""

    tokens: torch.Tensor  # [sampled rows] on the model's device
    sampled: Sampled
    result: ForwardResult | None
    started: float  # perf_counter seconds
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Swap:
    """Command to the other ranks: copy KV blocks (device, host) out, then (host, device) in."""

    out: list[tuple[int, int]]
    into: list[tuple[int, int]]
    window_out: list[tuple[int, int]] = field(default_factory=list)
    window_into: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Forward:
    """Command to the other ranks: run the model over this step's flat batch."""

    inp: ModelInput


@dataclass
class Rebalance:
    """Command to the other ranks: move expert weights to this placement."""

    placement: Placement
