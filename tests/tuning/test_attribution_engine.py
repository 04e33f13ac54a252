"""Latency attribution over the real engine's telemetry and request records, on scripted
workloads whose main cause is known."""

import random
from typing import Any

import pytest

from engine import LLMEngine, SamplingParams
from tuning.attribution.causes import attribute
from tuning.attribution.summary import shares

MODEL = "synthetic:tiny"


def run_engine(
    work: list[tuple[int, int, int]], **engine: Any
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(arrival step, prompt length, output length) requests; each one's timeline by id, in
    arrival order, and the steps."""
    eng = LLMEngine(model=MODEL, **engine)
    rng = random.Random(0)
    steps: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    pending, order = sorted(work), []
    while pending or eng.has_unfinished():
        while pending and (pending[0][0] <= len(steps) or not eng.has_unfinished()):
            _, prompt, output = pending.pop(0)
            params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
            req = eng.add_request([rng.randrange(256) for _ in range(prompt)], params)
            order.append(req)
        result = eng.step()
        steps.append(result.telemetry.model_dump())
        records.extend(r.model_dump() for r in result.ended)
    by_id = {t.req: t.as_dict() for t in attribute(records, steps)}
    return {rid: by_id[rid] for rid in order}, steps


def test_one_slot_five_requests_together_queue_for_the_slot() -> None:
    out, _ = run_engine([(0, 20, 6)] * 5, max_num_seqs=1)
    for t in list(out.values())[1:]:
        top = shares([t["ttft"]])  # largest first
        assert next(iter(top)) == "queue_slots" and top["queue_slots"] > 0.5


def test_a_tiny_kv_cache_queues_for_kv() -> None:
    """Each 70-token prompt takes 9 of the 16 blocks: one runs at a time."""
    out, _ = run_engine([(0, 70, 6)] * 4, num_kv_blocks=16, block_size=8)
    for t in list(out.values())[1:]:
        top = shares([t["ttft"]])
        assert next(iter(top)) == "queue_kv" and top["queue_kv"] > 0.5


def test_a_long_prompt_beside_decodes_taxes_them() -> None:
    """Four requests decode; a 1000-token prompt arrives at step 10 and prefills in chunks of
    128 beside them, which makes their steps slower than decode-only ones."""
    work = [(0, 8, 60)] * 4 + [(10, 1000, 2)]
    out, _ = run_engine(work, prefill_chunk_size=128, max_num_batched_tokens=256)
    decodes = list(out.values())[:4]
    for t in decodes:
        assert t["after_first_token"].get("decode_tax", 0) > 0
    assert shares([t["after_first_token"] for t in decodes])["decode_tax"] > 0.1
    assert "decode_tax" not in list(out.values())[4]["after_first_token"]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_causes_add_up_to_ttft_and_e2e_and_preemption_shows(mode: str, overlap: bool) -> None:
    """Every request's causes add up to its TTFT and E2E (each cause is rounded to the
    microsecond), with overlap too, where each step's recorded span reaches back into the
    step before."""
    rng = random.Random(3)
    work = [(rng.randrange(30), rng.randrange(4, 90), rng.randrange(1, 30)) for _ in range(30)]
    out, steps = run_engine(
        work,
        num_kv_blocks=24,
        block_size=8,
        num_host_blocks=64,
        preemption_mode=mode,
        max_num_batched_tokens=64,
        prefill_chunk_size=32,
        overlap=overlap,
    )
    assert sum(len(s["sched"]["preempted"]) for s in steps) > 0
    for t in out.values():
        ttft = sum(t["ttft"].values())
        assert ttft == pytest.approx(t["ttft_ms"], abs=0.01)
        assert ttft + sum(t["after_first_token"].values()) == pytest.approx(t["e2e_ms"], abs=0.01)
    preempted = [t for t in out.values() if "preemption" in {**t["ttft"], **t["after_first_token"]}]
    assert preempted
