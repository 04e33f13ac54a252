"""StepTelemetry: the one record each step publishes (field names are a contract, see DESIGN.md)."""

from typing import Any, Literal

from pydantic import BaseModel

TELEMETRY_VERSION = 2  # 2: `sched`, why waiting requests waited


class Durations(BaseModel):
    schedule: float
    prepare: float
    forward: float
    moe: float
    sample: float
    total: float
    host: float = 0.0  # the step's host work: schedule + prepare + sample (its update)
    hidden: float = 0.0  # the part of `host` that ran while a forward pass ran (overlap)


class Slot(BaseModel):
    slot: int
    req: str
    phase: Literal["prefill", "decode"]
    tokens: int
    ctx: int


class BatchInfo(BaseModel):
    max_slots: int
    token_budget: int
    num_prefill_tokens: int
    num_decode_tokens: int
    slots: list[Slot]


class QueueInfo(BaseModel):
    """Queue lengths after the step, and what arrived, finished or was preempted during it."""

    waiting: int
    running: int
    swapped: int
    arrived: int
    finished: int
    preempted: int


BlockReason = Literal["slots", "budget", "kv", "swapped", "static"]


class SchedInfo(BaseModel):
    """Why requests were left waiting this step: the blocking reason at the head of the waiting
    queue (None when nothing was left waiting), the latest arrival among that head and the
    requests admitted (a request left waiting that arrived earlier was passed over by the
    policy), and the requests preempted."""

    blocked: BlockReason | None = None
    ahead_arrival: float | None = None
    preempted: list[str] = []


class KVInfo(BaseModel):
    block_size: int
    total: int
    usable: int
    used: int
    cached: int
    free: int
    tokens: int
    watermark_blocks: int
    host_total: int
    host_used: int
    prefix_hit_rate: float
    # gpt-oss: the sliding layers have their own pool (engine.window_pool); behind_window:
    # used blocks it does not hold because they fell behind the window (blocks saved)
    behind_window: int = 0
    window_total: int = 0
    window_used: int = 0
    # what one token costs in one layer's cache (MLA's latent or K and V); 0 when not known
    bytes_per_token_layer: int = 0


class ExpertInfo(BaseModel):
    layers: int
    experts: int
    top_k: int
    counts: list[list[int]]
    dropped: list[int]
    balance: list[float]
    # the real layer index of each row of `counts` (dense layers have none; empty in records
    # from before: rows 0..layers-1), and with group-limited routing (DeepSeek) how many
    # tokens chose each expert group, [row][group]
    moe_layers: list[int] = []
    groups: list[list[int]] = []


class A2AInfo(BaseModel):
    """Bytes sent [from][to] by the all-to-alls (dispatch plus combine) and by the all-gathers
    of MoE output rows (attention is replicated), pairs computed per rank, per-rank
    grouped-GEMM time (measured mode only) and the rank-load imbalance of the step."""

    ep_size: int
    mode: Literal["measured", "modeled"]
    bytes: list[list[int]]
    gather_bytes: list[list[int]] = []
    rank_tokens: list[int] = []
    rank_moe_ms: list[float] = []
    imbalance: float = 1.0
    placement_version: int = 1


class LatencyInfo(BaseModel):
    ttft_ms: list[float]
    tpot_ms: list[float]


class KnobChange(BaseModel):
    """One applied knob change: version, when, who, {field: [old, new]} and why, in words
    (the autopilot's reason; None when no reason was given)."""

    version: int
    t: float
    origin: str
    changes: dict[str, list[Any]]
    reason: str | None = None


class RequestRecord(BaseModel):
    """One request's end (finished, aborted or failed): published once on the loop's request
    bus, where /metrics and the recorder read it."""

    req: str
    arrival: float
    finished_t: float
    prompt_len: int
    output_len: int
    max_tokens: int
    ttft_ms: float | None
    finish_reason: str
    preemptions: int
    e2e_ms: float
    priority: int = 0  # SamplingParams.priority (records from before it have none: 0)
    prompt_token_ids: list[int] | None = None  # with EngineConfig.record_prompts (reruns)


class StepTelemetry(BaseModel):
    v: int = TELEMETRY_VERSION
    session: str
    step: int
    t: float
    knobs_version: int
    dur_ms: Durations
    batch: BatchInfo
    queue: QueueInfo
    kv: KVInfo
    experts: ExpertInfo
    a2a: A2AInfo
    latency: LatencyInfo
    knob_changes: list[KnobChange] = []
    sched: SchedInfo = SchedInfo()  # v1 records have none
