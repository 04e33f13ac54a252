"""A step's record is built from its typed account (`StepStats`) alone and carries every field
of DESIGN.md's StepTelemetry contract, with the values the step's parts give it."""

import torch

from engine.ep.placement import Placement
from engine.knobs import Knobs
from engine.kv_cache import BlockManager
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.step_records import ForwardResult
from engine.step_telemetry import EPInfo, StepStats, a2a_info, expert_counts_info, step_telemetry
from engine.telemetry import Durations

# DESIGN.md, "StepTelemetry": field names are the contract (fields may be added, never dropped)
CONTRACT = {
    "": {"v", "session", "step", "t", "knobs_version", "dur_ms", "batch", "queue", "kv"}
    | {"experts", "a2a", "latency"},
    "dur_ms": {"schedule", "prepare", "forward", "moe", "sample", "total"},
    "batch": {"max_slots", "token_budget", "num_prefill_tokens", "num_decode_tokens", "slots"},
    "slot": {"slot", "req", "phase", "tokens", "ctx"},
    "queue": {"waiting", "running", "swapped", "arrived", "finished", "preempted"},
    "kv": {"block_size", "total", "usable", "used", "cached", "free", "tokens"},
    "experts": {"layers", "experts", "top_k", "counts", "dropped", "balance"},
    "a2a": {"ep_size", "mode", "bytes"},
    "latency": {"ttft_ms", "tpot_ms"},
}


def one_step() -> StepStats:
    """One slot, two 6-token prompts: the first prefills, the second waits for the slot."""
    blocks = BlockManager(8, 4, 0, True)
    context = {"total_blocks": 8, "min_blocks": 1, "ep_size": 1}
    values = {"max_num_seqs": 1, "max_num_batched_tokens": 16, "prefill_chunk_size": 16}
    knobs = Knobs.model_validate(values, context=context)
    scheduler = Scheduler(blocks, knobs, "continuous")
    params = SamplingParams(max_tokens=4)
    for rid in ("a", "b"):
        scheduler.add(Request(list(range(1, 7)), params, rid, 10.0))
    out = scheduler.schedule()
    scheduler.advance(out)
    ep = EPInfo(Placement.contiguous(1, 4, 2), "modeled", row_bytes=8, num_layers=1)
    pairs = torch.tensor([[[3, 2], [1, 6]]])  # [layers, src, dst]
    result = ForwardResult(torch.zeros(1, 1), torch.zeros(1, 4), torch.zeros(1), 0.0, pairs)
    return StepStats(
        session="s",
        knobs_version=3,
        t=12.5,
        sched=out,
        scheduler=scheduler.stats(),
        arrived=2,
        finished=[],
        knob_changes=[],
        dur_ms=Durations(schedule=1.0, prepare=2.0, forward=3.0, moe=1.5, sample=0.5, total=7.0),
        experts=expert_counts_info(torch.tensor([[5, 1, 0, 6]]), [0], 2),
        a2a=a2a_info(ep, result, rows=6),
    )


def test_the_record_has_every_field_of_the_contract() -> None:
    record = step_telemetry(one_step()).model_dump()
    assert CONTRACT[""] <= set(record)
    for name, fields in CONTRACT.items():
        if name not in ("", "slot"):
            assert fields <= set(record[name]), name
    assert CONTRACT["slot"] <= set(record["batch"]["slots"][0])


def test_the_record_holds_what_the_step_did() -> None:
    record = step_telemetry(one_step()).model_dump()
    assert (record["session"], record["step"], record["t"], record["knobs_version"]) == (
        "s",
        0,
        12.5,
        3,
    )
    assert record["batch"] == {
        "max_slots": 1,
        "token_budget": 16,
        "num_prefill_tokens": 6,
        "num_decode_tokens": 0,
        "slots": [{"slot": 0, "req": "a", "phase": "prefill", "tokens": 6, "ctx": 6}],
    }
    assert record["queue"] == {
        "waiting": 1,
        "running": 1,
        "swapped": 0,
        "arrived": 2,
        "finished": 0,
        "preempted": 0,
    }
    kv = record["kv"]
    assert (kv["block_size"], kv["total"], kv["used"], kv["tokens"]) == (4, 8, 2, 6)
    assert record["sched"] == {"blocked": "slots", "ahead_arrival": 10.0, "preempted": []}
    assert record["experts"]["balance"] == [0.5]
    # rank 0 sends rank 1 the 2 pairs computed there and the results of the 1 pair from it
    assert record["a2a"]["bytes"] == [[0, 3 * 8], [3 * 8, 0]]
    assert record["a2a"]["rank_tokens"] == [4, 8]
