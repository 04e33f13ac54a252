"""Builds a step's StepTelemetry from a typed account of what the step did (`StepStats`), which
the engine, or the twin for a simulated step, makes; reads no engine state."""

from dataclasses import dataclass
from typing import Literal

import torch

from engine.config import ModelConfig
from engine.ep.placement import Placement, a2a_bytes, gather_bytes, imbalance
from engine.request import Request
from engine.scheduler import SchedulerOutput, SchedulerStats
from engine.step_records import ForwardResult
from engine.telemetry import (
    A2AInfo,
    BatchInfo,
    Durations,
    ExpertInfo,
    KnobChange,
    KVInfo,
    LatencyInfo,
    QueueInfo,
    SchedInfo,
    StepTelemetry,
)
from stats import tpot


@dataclass(frozen=True)
class StepStats:
    """Everything one step's record is made of."""

    session: str
    knobs_version: int  # the knobs the step ran under
    t: float  # unix seconds (the twin's: its simulated clock)
    sched: SchedulerOutput  # what the step ran
    scheduler: SchedulerStats  # queues and cache once the step's requests advanced
    arrived: int  # requests queued since the step before
    finished: list[Request]
    knob_changes: list[KnobChange]  # applied at this step's boundary
    dur_ms: Durations
    experts: ExpertInfo
    a2a: A2AInfo
    kv_bytes_per_token_layer: int = 0  # the model's (the twin's simulated steps: 0)


@dataclass(frozen=True)
class EPInfo:
    """What a step's all-to-all figures are worked out from, besides its forward result."""

    placement: Placement
    mode: Literal["measured", "modeled"]
    row_bytes: int  # one token row in the all-to-all: hidden size x element size
    num_layers: int


def step_telemetry(step: StepStats) -> StepTelemetry:
    """The record of one step (the engine's, or the twin's on its simulated clock)."""
    sched, stats, finished = step.sched, step.scheduler, step.finished
    return StepTelemetry(
        session=step.session,
        step=sched.step,
        t=step.t,
        knobs_version=step.knobs_version,
        dur_ms=step.dur_ms,
        batch=BatchInfo(
            max_slots=stats.max_slots,
            token_budget=stats.token_budget,
            num_prefill_tokens=sched.num_prefill_tokens,
            num_decode_tokens=sched.num_decode_tokens,
            # dicts, which pydantic turns into Slots in one pass: a Slot made one by one costs
            # about twice as much, for every running request every step
            slots=[
                {
                    "slot": c.slot,
                    "req": c.req.request_id,
                    "phase": "prefill" if c.is_prefill else "decode",
                    "tokens": c.num_tokens,
                    "ctx": c.start + c.num_tokens,
                }
                for c in sched.chunks
            ],
        ),
        queue=QueueInfo(
            waiting=stats.waiting,
            running=stats.running,
            swapped=stats.swapped,
            arrived=step.arrived,
            finished=len(finished),
            preempted=len(sched.preempted),
        ),
        kv=kv_info(stats, step.kv_bytes_per_token_layer),
        experts=step.experts,
        a2a=step.a2a,
        latency=LatencyInfo(
            ttft_ms=[round(r.ttft_s * 1000, 3) for r in finished if r.ttft_s is not None],
            tpot_ms=[
                round(tp * 1000, 3) for r in finished if (tp := tpot(r.token_times)) is not None
            ],
        ),
        knob_changes=step.knob_changes,
        sched=SchedInfo(
            blocked=sched.blocked,
            ahead_arrival=sched.ahead_arrival,
            preempted=[r.request_id for r in sched.preempted],
        ),
    )


def durations(
    seconds: list[float], moe_s: float, host_s: float | None = None, hidden_s: float = 0.0
) -> Durations:
    """`seconds`: schedule, prepare, forward, sample and total, as measured around a step;
    `host_s`: the step's host work (schedule + prepare + sample when not given), `hidden_s`
    the part of it that ran while a forward pass ran."""
    ms = [round(d * 1000, 3) for d in seconds]
    host = seconds[0] + seconds[1] + seconds[3] if host_s is None else host_s
    return Durations(
        schedule=ms[0],
        prepare=ms[1],
        forward=ms[2],
        moe=round(moe_s * 1000, 3),
        sample=ms[3],
        total=ms[4],
        host=round(host * 1000, 3),
        hidden=round(hidden_s * 1000, 3),
    )


def kv_info(stats: SchedulerStats, bytes_per_token_layer: int = 0) -> KVInfo:
    s = stats.kv
    return KVInfo(
        block_size=s.block_size,
        total=s.total,
        usable=s.usable,
        used=s.used,
        cached=s.cached,
        free=s.free,
        tokens=stats.kv_tokens,
        behind_window=s.behind_window,
        window_total=s.window_total,
        window_used=s.window_used,
        bytes_per_token_layer=bytes_per_token_layer,
        watermark_blocks=stats.watermark_blocks,
        host_total=s.host_total,
        host_used=s.host_used,
        prefix_hit_rate=s.prefix_hit_rate,
    )


def expert_info(cfg: ModelConfig, result: ForwardResult | None) -> ExpertInfo:
    if result is None:
        counts = torch.zeros(cfg.num_moe_layers, cfg.num_experts, dtype=torch.long)
        dropped = [0] * cfg.num_moe_layers
    else:
        counts = result.expert_counts
        dropped = result.expert_dropped.tolist()
    info = expert_counts_info(counts, dropped, cfg.top_k)
    info.moe_layers = cfg.moe_layers
    if result is not None and result.group_counts is not None:
        info.groups = result.group_counts.tolist()
    return info


def expert_counts_info(counts: torch.Tensor, dropped: list[int], top_k: int) -> ExpertInfo:
    """ExpertInfo for routed counts [layers, experts] and dropped pairs per layer."""
    peak = counts.max(dim=1).values.clamp(min=1)
    balance = (counts.float().mean(dim=1) / peak).tolist()
    return ExpertInfo(
        layers=counts.shape[0],
        experts=counts.shape[1],
        top_k=top_k,
        counts=counts.tolist(),
        dropped=dropped,
        balance=[round(x, 4) for x in balance],
    )


def a2a_info(ep: EPInfo, result: ForwardResult | None, rows: int) -> A2AInfo:
    """The step's all-to-all figures: measured by the ranks, else modeled from the placement
    for its `rows` token rows; all zero when nothing ran."""
    size = ep.placement.ep_size
    moe_ms: list[float] = []
    if result is None:
        volume = gathered = [[0] * size for _ in range(size)]
        per_layer = torch.zeros(ep.num_layers, size, dtype=torch.long)
    elif result.measured is not None:
        volume, per_layer = result.measured.bytes, result.measured.computed
        gathered, moe_ms = result.measured.gather_bytes, result.measured.compute_ms
    else:
        assert result.rank_pairs is not None
        volume = a2a_bytes(result.rank_pairs, ep.row_bytes)
        per_layer = result.rank_pairs.sum(1)
        gathered = gather_bytes(size, rows, per_layer.shape[0], ep.row_bytes)
    return A2AInfo(
        ep_size=size,
        mode=ep.mode,
        bytes=volume,
        gather_bytes=gathered,
        rank_tokens=per_layer.sum(0).tolist(),
        rank_moe_ms=moe_ms,
        imbalance=imbalance(per_layer),
        placement_version=ep.placement.version,
    )
