"""Greedy output under continuous batching equals each request run alone."""

import pytest
from workloads import make_prompts, run_staggered, tokens

from engine import LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _alone(prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=256, block_size=4)
    results = []
    for p in prompts:
        rid = engine.add_request(p, params)
        tokens: list[int] = []
        while engine.has_unfinished():
            for out in engine.step().outputs:
                if out.request_id == rid and out.finished:
                    tokens = out.token_ids
        results.append(tokens)
    return results


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(14)


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    return _alone(prompts, GREEDY)


def test_roomy_cache_with_chunked_prefill_and_prefix_hits(prompts, expected) -> None:
    engine = LLMEngine(
        model="synthetic:tiny",
        num_kv_blocks=256,
        block_size=4,
        prefill_chunk_size=7,
        max_num_batched_tokens=24,
        max_num_seqs=6,
    )
    outs, tele = run_staggered(engine, prompts, GREEDY)
    got = tokens(outs)
    assert got == expected
    assert any(t["batch"]["num_prefill_tokens"] and t["batch"]["num_decode_tokens"] for t in tele)
    assert engine.blocks.prefix_hits > 0
    assert engine.blocks.num_used == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tiny_pool_forces_preemption(prompts, expected, mode: str) -> None:
    engine = LLMEngine(
        model="synthetic:tiny",
        num_kv_blocks=14,
        block_size=4,
        num_host_blocks=64,
        preemption_mode=mode,
        prefill_chunk_size=8,
        max_num_batched_tokens=32,
        max_num_seqs=8,
    )
    outs, tele = run_staggered(engine, prompts, GREEDY)
    got = tokens(outs)
    assert got == expected
    assert sum(t["queue"]["preempted"] for t in tele) > 0
    if mode == "swap":
        assert any(t["queue"]["swapped"] for t in tele)
    assert engine.blocks.num_used == 0
    assert len(engine.blocks.host_free) == 64


def test_swap_falls_back_to_recompute_without_host_space(prompts, expected) -> None:
    engine = LLMEngine(
        model="synthetic:tiny",
        num_kv_blocks=14,
        block_size=4,
        num_host_blocks=0,
        preemption_mode="swap",
        max_num_seqs=8,
        max_num_batched_tokens=32,
    )
    outs, tele = run_staggered(engine, prompts, GREEDY)
    got = tokens(outs)
    assert got == expected
    assert sum(t["queue"]["preempted"] for t in tele) > 0


@pytest.mark.parametrize("policy", ["priority", "shortest_first"])
def test_policies_keep_outputs(prompts, expected, policy: str) -> None:
    engine = LLMEngine(
        model="synthetic:tiny",
        num_kv_blocks=20,
        block_size=4,
        policy=policy,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        prefill_chunk_size=16,
    )
    got = tokens(run_staggered(engine, prompts, GREEDY)[0])
    assert got == expected


def test_static_batching_holds_slots_until_the_batch_ends(prompts, expected) -> None:
    engine = LLMEngine(
        model="synthetic:tiny", num_kv_blocks=256, block_size=4, batching="static", max_num_seqs=4
    )
    params = [
        SamplingParams(max_tokens=3 + 3 * (i % 4), temperature=0.0, ignore_eos=True)
        for i in range(8)
    ]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts[:8], params, strict=True)]
    members: list[set[str]] = []
    while engine.has_unfinished():
        slots = {s["req"] for s in engine.step().telemetry.model_dump()["batch"]["slots"]}
        if slots and (not members or not slots <= members[-1]):
            members.append(slots)
    assert members == [set(ids[:4]), set(ids[4:])]


def test_continuous_batch_refills_freed_slots(prompts) -> None:
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=256, block_size=4, max_num_seqs=4)
    for i, p in enumerate(prompts[:8]):
        engine.add_request(
            p, SamplingParams(max_tokens=2 + 4 * (i % 2), temperature=0.0, ignore_eos=True)
        )
    live, occupancy, expected = 8, [], []
    while engine.has_unfinished():
        tele = engine.step().telemetry
        occupancy.append(len(tele.batch.slots))
        expected.append(min(4, live))
        live = tele.queue.waiting + tele.queue.running
    assert occupancy == expected
    assert occupancy.count(4) >= 6


def test_abort_frees_blocks_within_the_step() -> None:
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=64, block_size=4)
    rid = engine.add_request(list(range(40)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.blocks.num_used > 0
    assert engine.abort(rid)
    assert engine.blocks.num_used == 0
    assert not engine.abort(rid)
    assert not engine.has_unfinished()


def test_bad_requests_are_refused_before_state_changes() -> None:
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=8, block_size=4)
    cases = [
        ([], "empty"),
        ([1] * 1024, "max_model_len"),
        ([1] * 10, "KV blocks"),
        ([99999], "vocabulary"),
        ([1.5, 2], "1.5 is not an integer"),
        ([True, 2], "True is not an integer"),
        (["a"], "'a' is not an integer"),
    ]
    for prompt, words in cases:
        with pytest.raises(ValueError, match=words):
            engine.add_request(prompt, SamplingParams(max_tokens=40))
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    engine.add_request([1, 2], request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1, 2], request_id="a")
    for bad_id in (5, ""):
        with pytest.raises(ValueError, match="request_id must be a non-empty string"):
            engine.add_request([1, 2], request_id=bad_id)
    assert list(engine.requests) == ["a"]
    assert engine.requests[engine.add_request([1, 2], arrival=0.0)].arrival == 0.0


def test_automatic_ids_skip_ids_a_caller_took() -> None:
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=32, block_size=4)
    first = engine.add_request([1, 2])
    taken = [f"req-{int(first.removeprefix('req-')) + n}" for n in (2, 4, 6)]
    for rid in taken:
        engine.add_request([3, 4], request_id=rid)
    auto = [engine.add_request([5, 6]) for _ in range(3)]
    assert len({first, *taken, *auto}) == len(engine.requests) == 7
    assert all(engine.abort(rid) for rid in taken)
    assert set(engine.requests) == {first, *auto}


@pytest.mark.parametrize(
    "args, words",
    [
        ({"model": "synthetic:nope"}, "unknown synthetic preset"),
        ({"model": "/no/such/dir"}, "unknown model"),
        ({"model": "synthetic:tiny", "dtype": "int8"}, "dtype"),
        ({"model": "synthetic:tiny", "bogus": 1}, "bogus"),
        ({"model": "synthetic:tiny", "ep_size": 3}, "ep_size"),
        ({"model": "synthetic:tiny", "router_skew": float("nan")}, "router_skew"),
        ({"model": "synthetic:tiny", "router_skew": float("inf")}, "router_skew"),
    ],
)
def test_bad_engine_arguments(args: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LLMEngine(**args)


def test_bfloat16_engine_tracks_float32(prompts) -> None:
    """bf16 runs the same model: first-token log-probabilities stay close to float32's."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        engine = LLMEngine(model="synthetic:tiny", dtype=dtype, num_kv_blocks=64, block_size=4)
        ids = [engine.add_request(p, params) for p in prompts[:4]]
        done = {}
        while engine.has_unfinished():
            done.update({o.request_id: o for o in engine.step().outputs if o.finished})
        runs[dtype] = [done[i] for i in ids]
    assert all(len(o.token_ids) == 6 for o in runs["bfloat16"])
    for full, half in zip(runs["float32"], runs["bfloat16"], strict=True):
        top = full.token_ids[0]
        assert half.logprobs[0].get(top) == pytest.approx(full.logprobs[0][top], abs=0.1)


def test_a_requests_record_carries_its_priority() -> None:
    engine = LLMEngine(model="synthetic:tiny")
    for priority in (3, -2):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, priority=priority))
    ended = []
    while engine.has_unfinished():
        ended += engine.step().ended
    assert sorted(r.priority for r in ended) == [-2, 3]
