"""Live knobs: validated as a whole, refused without side effects, applied at the next step."""

from typing import Any

import pydantic
import pytest

from engine import Knobs, LLMEngine, SamplingParams, StepTelemetry
from engine.errors import InvalidInput

NUM_BLOCKS = 32
BLOCK_SIZE = 4


def make_engine() -> LLMEngine:
    return LLMEngine(
        model="synthetic:tiny", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, num_host_blocks=8
    )


def prompt(n: int) -> list[int]:
    return [256, *(1 + i % 200 for i in range(n - 1))]


def step(engine: LLMEngine) -> StepTelemetry:
    return engine.step().telemetry


# (changes, field the refusal must name)
BAD_CHANGES: list[tuple[dict[str, Any], str]] = [
    ({"max_num_seqs": "many"}, "max_num_seqs"),
    ({"max_num_seqs": 1.5}, "max_num_seqs"),
    ({"max_num_seqs": None}, "max_num_seqs"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
    ({"prefill_chunk_size": -8}, "prefill_chunk_size"),
    ({"policy": "lifo"}, "policy"),
    ({"policy": 1}, "policy"),
    ({"preemption_mode": "drop"}, "preemption_mode"),
    ({"kv_watermark": 0.75}, "kv_watermark"),
    ({"kv_watermark": -0.1}, "kv_watermark"),
    ({"kv_watermark": "lots"}, "kv_watermark"),
    ({"max_num_seqs": True}, "max_num_seqs"),
    ({"max_num_seqs": "8"}, "max_num_seqs"),
    ({"max_num_seqs": 8.0}, "max_num_seqs"),
    ({"kv_watermark": "0.1"}, "kv_watermark"),
    ({"expert_capacity_factor": 0.0}, "expert_capacity_factor"),
    ({"kv_capacity_blocks": 0}, "kv_capacity_blocks"),
    ({"kv_capacity_blocks": NUM_BLOCKS + 1}, "kv_capacity_blocks"),
    ({"max_batch": 8}, "max_batch"),
    ({"prefill_chunk_size": 4096}, "prefill_chunk_size"),
    ({"max_num_batched_tokens": 256}, "prefill_chunk_size"),
    (
        {"max_num_seqs": 128, "max_num_batched_tokens": 100, "prefill_chunk_size": 64},
        "max_num_batched_tokens",
    ),
    ({"prefill_chunk_size": 0, "max_num_batched_tokens": 512}, "prefill_chunk_size"),
]


@pytest.mark.parametrize(("changes", "field"), BAD_CHANGES)
def test_bad_change_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    engine = make_engine()
    rid = engine.add_request(prompt(10), SamplingParams(max_tokens=4))
    before = engine.knobs
    with pytest.raises(InvalidInput) as info:
        engine.update_knobs(**changes)
    assert info.value.param == field
    assert field in str(info.value)
    assert engine.knobs == before
    assert engine.knobs_version == 1
    telemetry = step(engine)
    assert engine.knobs == before
    assert telemetry.knobs_version == 1
    assert telemetry.knob_changes == []
    assert engine.knob_changes == []
    assert telemetry.batch.slots[0].req == rid


def test_refusals_check_every_bad_field_in_one_change() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Knobs(max_num_seqs=0, policy="lifo", kv_watermark=2.0)
    assert {e["loc"] for e in info.value.errors()} == {
        ("max_num_seqs",),
        ("policy",),
        ("kv_watermark",),
    }


def test_capacity_below_a_live_request_is_refused() -> None:
    engine = make_engine()
    engine.add_request(prompt(30), SamplingParams(max_tokens=10))  # 40 tokens = 10 blocks
    with pytest.raises(InvalidInput, match="kv_capacity_blocks"):
        engine.update_knobs(kv_capacity_blocks=9)
    assert engine.knobs_version == 1
    assert engine.update_knobs(kv_capacity_blocks=10) == 2


def test_refused_change_keeps_the_pending_one() -> None:
    engine = make_engine()
    assert engine.update_knobs(max_num_batched_tokens=64, prefill_chunk_size=32) == 2
    # judged against the pending set: a chunk above the pending budget is inconsistent
    with pytest.raises(InvalidInput, match="prefill_chunk_size"):
        engine.update_knobs(prefill_chunk_size=128)
    assert engine.knobs_version == 2
    telemetry = step(engine)
    assert telemetry.knobs_version == 2
    assert (engine.knobs.max_num_batched_tokens, engine.knobs.prefill_chunk_size) == (64, 32)


def test_good_change_applies_at_the_next_step() -> None:
    engine = make_engine()
    ids = [engine.add_request(prompt(6 + i), SamplingParams(max_tokens=8)) for i in range(4)]
    first = step(engine)
    assert first.knobs_version == 1
    assert first.batch.max_slots == 64
    assert {s.req for s in first.batch.slots} == set(ids)

    version = engine.update_knobs(
        origin="dashboard",
        max_num_seqs=2,
        max_num_batched_tokens=16,
        prefill_chunk_size=8,
        policy="shortest_first",
    )
    assert version == 2
    assert engine.knobs.max_num_seqs == 64  # not before the step boundary

    second = step(engine)
    assert second.knobs_version == 2
    assert (second.batch.max_slots, second.batch.token_budget) == (2, 16)
    assert len(second.batch.slots) == 2
    assert engine.knobs.max_num_seqs == 2
    assert engine.knobs.policy == "shortest_first"
    [change] = second.knob_changes
    assert change.version == 2
    assert change.origin == "dashboard"
    assert change.changes == {
        "max_num_seqs": [64, 2],
        "max_num_batched_tokens": [2048, 16],
        "prefill_chunk_size": [512, 8],
        "policy": ["fcfs", "shortest_first"],
    }
    assert engine.knob_changes == [change]

    third = step(engine)
    assert third.knobs_version == 2
    assert third.knob_changes == []
    assert len(third.batch.slots) <= 2


def test_versions_increase_and_origin_defaults_to_api() -> None:
    engine = make_engine()
    assert engine.update_knobs(kv_watermark=0.1) == 2
    step(engine)
    assert engine.update_knobs(kv_watermark=0.2) == 3
    telemetry = step(engine)
    assert telemetry.knobs_version == 3
    assert [(c.version, c.origin, c.changes) for c in engine.knob_changes] == [
        (2, "api", {"kv_watermark": [0.01, 0.1]}),
        (3, "api", {"kv_watermark": [0.1, 0.2]}),
    ]
    assert telemetry.kv.watermark_blocks == int(0.2 * NUM_BLOCKS)


def test_a_whole_number_is_a_float_knob() -> None:
    engine = make_engine()
    assert engine.update_knobs(kv_watermark=0) == 2
    step(engine)
    assert engine.knobs.kv_watermark == 0.0


def test_a_change_to_the_current_values_makes_no_version() -> None:
    engine = make_engine()
    assert engine.update_knobs(max_num_seqs=engine.knobs.max_num_seqs) == 1
    assert engine.update_knobs(kv_watermark=0.1) == 2
    assert engine.update_knobs(kv_watermark=0.1, max_num_seqs=engine.knobs.max_num_seqs) == 2
    telemetry = step(engine)
    assert [c.changes for c in telemetry.knob_changes] == [{"kv_watermark": [0.01, 0.1]}]
    assert engine.update_knobs(kv_watermark=0.1) == 2
    assert step(engine).knob_changes == [] and len(engine.knob_changes) == 1


def test_capacity_change_reaches_the_kv_telemetry() -> None:
    engine = make_engine()
    engine.update_knobs(kv_capacity_blocks=12)
    assert step(engine).kv.usable == 12
    engine.update_knobs(kv_capacity_blocks=None)
    assert step(engine).kv.usable == NUM_BLOCKS


def test_every_accepted_change_is_recorded() -> None:
    """Two changes made between the same two steps are both applied and both logged."""
    engine = make_engine()
    assert engine.update_knobs(origin="alice", max_num_seqs=8) == 2
    assert engine.update_knobs("bob", "watermark for bursts", kv_watermark=0.2) == 3
    telemetry = step(engine)
    assert telemetry.knobs_version == 3
    assert engine.knobs.max_num_seqs == 8
    recorded = [(c.version, c.origin, c.changes, c.reason) for c in telemetry.knob_changes]
    assert recorded == [
        (2, "alice", {"max_num_seqs": [64, 8]}, None),
        (3, "bob", {"kv_watermark": [0.01, 0.2]}, "watermark for bursts"),
    ]
    assert engine.knob_changes == telemetry.knob_changes


def test_request_added_while_capacity_shrink_is_pending_can_finish() -> None:
    """A request too big for a pending smaller capacity is refused, or else still finishes."""
    engine = make_engine()
    engine.update_knobs(kv_capacity_blocks=4)
    try:
        rid = engine.add_request(prompt(29), SamplingParams(max_tokens=8))  # needs 10 blocks
    except ValueError as err:
        assert "blocks" in str(err)
        return
    done = set()
    for _ in range(100):
        done |= {o.request_id for o in engine.step().outputs if o.finished}
        if not engine.has_unfinished():
            break
    assert rid in done


def test_expert_capacity_factor_applies_from_the_next_step() -> None:
    engine = make_engine()
    engine.add_request(prompt(24), SamplingParams(max_tokens=8))
    first = step(engine)
    assert first.experts.dropped == [0] * first.experts.layers
    engine.update_knobs(expert_capacity_factor=0.25)
    engine.add_request(prompt(30), SamplingParams(max_tokens=8))
    second = step(engine)
    assert all(d > 0 for d in second.experts.dropped)
    engine.update_knobs(expert_capacity_factor=None)
    engine.add_request(prompt(30), SamplingParams(max_tokens=8))
    third = step(engine)
    assert third.experts.dropped == [0] * third.experts.layers
