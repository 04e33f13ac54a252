"""Builds a step's StepTelemetry from what the step did; reads engine state, changes nothing."""

from typing import TYPE_CHECKING

import torch

from engine.ep.placement import a2a_bytes, gather_bytes, imbalance
from engine.outputs import tpot
from engine.request import Request
from engine.runner import ForwardResult
from engine.scheduler import SchedulerOutput
from engine.telemetry import (
    A2AInfo,
    BatchInfo,
    Durations,
    ExpertInfo,
    KnobChange,
    KVInfo,
    LatencyInfo,
    QueueInfo,
    Slot,
    StepTelemetry,
)

if TYPE_CHECKING:
    from engine.engine import LLMEngine


def step_telemetry(
    eng: "LLMEngine",
    sched: SchedulerOutput,
    result: ForwardResult | None,
    finished: list[Request],
    durations: list[float],
    applied: list[KnobChange],
    arrived: int,
    t: float,
) -> StepTelemetry:
    """The record of one step; `durations` are schedule, prepare, forward, sample and total s."""
    ms = [round(d * 1000, 3) for d in durations]
    moe_ms = round(result.moe_seconds * 1000, 3) if result else 0.0
    sch, knobs = eng.scheduler, eng.knobs
    return StepTelemetry(
        session=eng.session,
        step=sched.step,
        t=t,
        knobs_version=eng.applied_knobs_version,
        dur_ms=Durations(
            schedule=ms[0], prepare=ms[1], forward=ms[2], moe=moe_ms, sample=ms[3], total=ms[4]
        ),
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
            waiting=len(sch.waiting),
            running=len(sch.running),
            swapped=len(sch.swapped),
            arrived=arrived,
            finished=len(finished),
            preempted=len(sched.preempted),
        ),
        kv=kv_info(eng),
        experts=expert_info(eng, result),
        a2a=a2a_info(eng, result, sched.num_prefill_tokens + sched.num_decode_tokens),
        latency=LatencyInfo(
            ttft_ms=[round(r.ttft_s * 1000, 3) for r in finished if r.ttft_s is not None],
            tpot_ms=[
                round(tp * 1000, 3) for r in finished if (tp := tpot(r.token_times)) is not None
            ],
        ),
        knob_changes=applied,
    )


def kv_info(eng: "LLMEngine") -> KVInfo:
    s = eng.blocks.stats()
    return KVInfo(
        block_size=s.block_size,
        total=s.total,
        usable=s.usable,
        used=s.used,
        cached=s.cached,
        free=s.free,
        tokens=filled_kv_tokens(eng),
        watermark_blocks=int(eng.knobs.kv_watermark * s.usable),
        host_total=s.host_total,
        host_used=s.host_used,
        prefix_hit_rate=s.prefix_hit_rate,
    )


def filled_kv_tokens(eng: "LLMEngine") -> int:
    """Token slots filled in used blocks; shared prefix blocks are full and count once."""
    bs = eng.blocks.block_size
    partial = [
        r.num_computed_tokens % bs for r in eng.scheduler.running if r.num_computed_tokens % bs
    ]
    return (eng.blocks.num_used - len(partial)) * bs + sum(partial)


def expert_info(eng: "LLMEngine", result: ForwardResult | None) -> ExpertInfo:
    cfg = eng.model_config
    if result is None:
        counts = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.long)
        dropped = [0] * cfg.num_layers
    else:
        counts = result.expert_counts
        dropped = result.expert_dropped.tolist()
    peak = counts.max(dim=1).values.clamp(min=1)
    balance = (counts.float().mean(dim=1) / peak).tolist()
    return ExpertInfo(
        layers=cfg.num_layers,
        experts=cfg.num_experts,
        top_k=cfg.top_k,
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
