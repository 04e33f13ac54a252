"""Builds a step's StepTelemetry from what the step did; reads engine state, changes nothing."""

from typing import TYPE_CHECKING

import torch

from engine.config import ModelConfig
from engine.ep.placement import a2a_bytes, gather_bytes, imbalance
from engine.request import Request
from engine.runner import ForwardResult
from engine.scheduler import Scheduler, SchedulerOutput
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
    Slot,
    StepTelemetry,
)
from stats import tpot

if TYPE_CHECKING:
    from engine.engine import LLMEngine


def step_telemetry(
    session: str,
    knobs_version: int,
    scheduler: Scheduler,
    sched: SchedulerOutput,
    dur_ms: Durations,
    finished: list[Request],
    applied: list[KnobChange],
    arrived: int,
    t: float,
    experts: ExpertInfo,
    a2a: A2AInfo,
) -> StepTelemetry:
    """The record of one step (the engine's, or the twin's on its simulated clock)."""
    knobs = scheduler.knobs
    return StepTelemetry(
        session=session,
        step=sched.step,
        t=t,
        knobs_version=knobs_version,
        dur_ms=dur_ms,
        batch=BatchInfo(
            max_slots=knobs.max_num_seqs,
            token_budget=knobs.max_num_batched_tokens,
            num_prefill_tokens=sched.num_prefill_tokens,
            num_decode_tokens=sched.num_decode_tokens,
            slots=[
                Slot(
                    slot=c.slot,
                    req=c.req.request_id,
                    phase="prefill" if c.is_prefill else "decode",
                    tokens=c.num_tokens,
                    ctx=c.start + c.num_tokens,
                )
                for c in sched.chunks
            ],
        ),
        queue=QueueInfo(
            waiting=len(scheduler.waiting),
            running=len(scheduler.running),
            swapped=len(scheduler.swapped),
            arrived=arrived,
            finished=len(finished),
            preempted=len(sched.preempted),
        ),
        kv=kv_info(scheduler),
        experts=experts,
        a2a=a2a,
        latency=LatencyInfo(
            ttft_ms=[round(r.ttft_s * 1000, 3) for r in finished if r.ttft_s is not None],
            tpot_ms=[
                round(tp * 1000, 3) for r in finished if (tp := tpot(r.token_times)) is not None
            ],
        ),
        knob_changes=applied,
        sched=SchedInfo(
            blocked=sched.blocked,
            ahead_arrival=sched.ahead_arrival,
            preempted=[r.request_id for r in sched.preempted],
        ),
    )


def durations(seconds: list[float], moe_s: float) -> Durations:
    """`seconds`: schedule, prepare, forward, sample and total, as measured around a step."""
    ms = [round(d * 1000, 3) for d in seconds]
    return Durations(
        schedule=ms[0],
        prepare=ms[1],
        forward=ms[2],
        moe=round(moe_s * 1000, 3),
        sample=ms[3],
        total=ms[4],
    )


def kv_info(scheduler: Scheduler) -> KVInfo:
    s = scheduler.blocks.stats()
    return KVInfo(
        block_size=s.block_size,
        total=s.total,
        usable=s.usable,
        used=s.used,
        cached=s.cached,
        free=s.free,
        tokens=filled_kv_tokens(scheduler),
        watermark_blocks=int(scheduler.knobs.kv_watermark * s.usable),
        host_total=s.host_total,
        host_used=s.host_used,
        prefix_hit_rate=s.prefix_hit_rate,
    )


def filled_kv_tokens(scheduler: Scheduler) -> int:
    """Token slots filled in used blocks; shared prefix blocks are full and count once."""
    blocks = scheduler.blocks
    bs = blocks.block_size
    partial = [r.num_computed_tokens % bs for r in scheduler.running if r.num_computed_tokens % bs]
    return (blocks.num_used - len(partial)) * bs + sum(partial)


def expert_info(cfg: ModelConfig, result: ForwardResult | None) -> ExpertInfo:
    if result is None:
        counts = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.long)
        dropped = [0] * cfg.num_layers
    else:
        counts = result.expert_counts
        dropped = result.expert_dropped.tolist()
    return expert_counts_info(counts, dropped, cfg.top_k)


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


def a2a_info(eng: "LLMEngine", result: ForwardResult | None, rows: int) -> A2AInfo:
    placement = eng.placement
    ep = placement.ep_size
    moe_ms: list[float] = []
    if result is None:
        volume = gathered = [[0] * ep for _ in range(ep)]
        per_layer = torch.zeros(eng.model_config.num_layers, ep, dtype=torch.long)
    elif result.measured is not None:
        volume, per_layer = result.measured.bytes, result.measured.computed
        gathered, moe_ms = result.measured.gather_bytes, result.measured.compute_ms
    else:
        assert result.rank_pairs is not None
        elem = eng.model.embed_tokens.weight.element_size()
        row_bytes = eng.model_config.hidden_size * elem
        volume = a2a_bytes(result.rank_pairs, row_bytes)
        per_layer = result.rank_pairs.sum(1)
        gathered = gather_bytes(ep, rows, per_layer.shape[0], row_bytes)
    return A2AInfo(
        ep_size=ep,
        mode=eng.a2a_mode,
        bytes=volume,
        gather_bytes=gathered,
        rank_tokens=per_layer.sum(0).tolist(),
        rank_moe_ms=moe_ms,
        imbalance=imbalance(per_layer),
        placement_version=placement.version,
    )
