"""Scheduler with a real BlockManager and no model (in the style of vLLM's
tests/v1/core/test_scheduler.py): add requests, call `schedule()`, assert on the
SchedulerOutput and on queue and block state.

`complete` plays the engine's part after a forward (`LLMEngine._sample_and_update`):
computed tokens advance, full blocks are registered, sampling chunks append a token and a
request that reached `max_tokens` finishes.
"""

import itertools
from collections import Counter
from typing import Any

import pytest

from engine.config import Batching, Knobs
from engine.kv_cache import BlockManager
from engine.request import Request, Status
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput

BS = 4
_tokens = itertools.count(1000)  # fresh token ids, so prompts share no prefix unless meant to


def make_knobs(total_blocks: int, **values: Any) -> Knobs:
    """Knobs validated as LLMEngine._validate_knobs does (no model: no max_model_len).

    8 slots unless told (the default 64 would need a token budget of at least 64)."""
    context = {"total_blocks": total_blocks, "min_blocks": 1, "ep_size": 1}
    return Knobs.model_validate({"max_num_seqs": 8, **values}, context=context)


def make_scheduler(
    num_blocks: int = 64,
    num_host_blocks: int = 0,
    prefix_caching: bool = True,
    batching: Batching = "continuous",
    **knobs: Any,
) -> Scheduler:
    blocks = BlockManager(num_blocks, BS, num_host_blocks, prefix_caching)
    k = make_knobs(num_blocks, **knobs)
    blocks.set_usable(k.kv_capacity_blocks or num_blocks)
    return Scheduler(blocks, k, batching)


def set_knobs(sched: Scheduler, **changes: Any) -> None:
    """Apply a knob change as LLMEngine._apply_knobs does."""
    k = make_knobs(sched.blocks.total, **{**sched.knobs.model_dump(), **changes})
    sched.knobs = k
    sched.blocks.set_usable(k.kv_capacity_blocks or sched.blocks.total)


def add(
    sched: Scheduler,
    rid: str,
    prompt: int | list[int],
    max_tokens: int = 16,
    priority: int = 0,
) -> Request:
    tokens = [next(_tokens) for _ in range(prompt)] if isinstance(prompt, int) else prompt
    params = SamplingParams(max_tokens=max_tokens, priority=priority)
    req = Request(tokens, params, request_id=rid)
    sched.add(req)
    return req


def complete(sched: Scheduler, out: SchedulerOutput) -> list[Request]:
    """What the engine does once the step's forward ran; returns the requests that finished."""
    sampling = [c.req for c in out.chunks if c.sample]
    sched.advance(out)
    finished = []
    for req in sampling:
        req.append_token(7, 0.0)
        if len(req.output_token_ids) >= req.params.max_tokens:
            sched.finish(req, "length")
            finished.append(req)
    return finished


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    complete(sched, out)
    check_state(sched)
    return out


def chunks(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    """(request id, start, num_tokens, is_prefill) of each chunk, in batch order."""
    return [(c.req.request_id, c.start, c.num_tokens, c.is_prefill) for c in out.chunks]


def ids(reqs: Any) -> list[str]:
    return [r if isinstance(r, str) else r.request_id for r in reqs]


def check_state(sched: Scheduler) -> None:
    """Queues, slots, ref counts, block states and the host pool are consistent."""
    bm = sched.blocks
    for r in sched.running:
        assert r.status is Status.RUNNING and r.slot is not None
    for r in sched.waiting:
        assert r.status is Status.WAITING and r.block_table == [] and r.slot is None
    for r in sched.swapped:
        assert r.status is Status.SWAPPED and r.block_table == [] and r.host_blocks
    slots = [r.slot for r in sched.running]
    assert len(set(slots)) == len(slots)
    refs = Counter(b for r in sched.running for b in r.block_table)
    blocks = [bm.blocks[i] for i in range(bm.total)]
    for block in blocks:
        assert block.ref_count == refs[block.block_id], block
    used = {b.block_id for b in blocks if b.ref_count > 0}
    cached, free = set(bm.cached), list(bm.free_ids)
    assert len(set(free)) == len(free)
    assert len(used) + len(cached) + len(free) == bm.total
    assert used | cached | set(free) == set(range(bm.total))
    assert bm.num_used == len(used)
    host = sorted([h for r in sched.swapped for h in r.host_blocks] + list(bm.host_free))
    assert host == sorted(set(host))


def drain(sched: Scheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outs = []
    while sched.num_unfinished:
        assert len(outs) < max_steps, "no progress"
        outs.append(step(sched))
    return outs


def assert_all_blocks_back(sched: Scheduler, num_host_blocks: int = 0) -> None:
    bm = sched.blocks
    assert (sched.running, list(sched.waiting), list(sched.swapped)) == ([], [], [])
    assert bm.num_used == 0
    assert bm.num_free + bm.num_cached == bm.total
    assert all(bm.blocks[i].ref_count == 0 for i in range(bm.total))
    assert sorted(bm.host_free) == list(range(num_host_blocks))
    assert sorted(sched.free_slots) == list(range(sched.next_slot))
    check_state(sched)


# order, budget, chunking, slots


def test_running_decodes_come_before_prefill_chunks() -> None:
    sched = make_scheduler(max_num_batched_tokens=8, prefill_chunk_size=4)
    add(sched, "A", 10)
    add(sched, "B", 3)
    assert chunks(step(sched)) == [("A", 0, 4, True), ("B", 0, 3, True)]
    # A is older, but B decodes now and A is still prefilling
    assert chunks(step(sched)) == [("B", 3, 1, False), ("A", 4, 4, True)]
    out = sched.schedule()
    assert chunks(out) == [("B", 4, 1, False), ("A", 8, 2, True)]
    assert [c.sample for c in out.chunks] == [True, True]  # read before the step completes
    complete(sched, out)
    assert chunks(step(sched)) == [("A", 10, 1, False), ("B", 5, 1, False)]


def test_chunked_prefill_splits_a_prompt_and_samples_only_at_its_end() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, prefill_chunk_size=6)
    a = add(sched, "A", 15)
    seen = []
    for _ in range(3):
        out = sched.schedule()
        sample = out.chunks[0].sample  # start + num_tokens == num_tokens, before the token
        complete(sched, out)
        seen.append((chunks(out), sample, a.num_computed_tokens, a.num_tokens))
    assert seen == [
        ([("A", 0, 6, True)], False, 6, 15),
        ([("A", 6, 6, True)], False, 12, 15),
        ([("A", 12, 3, True)], True, 15, 16),
    ]
    assert chunks(step(sched)) == [("A", 15, 1, False)]


def test_token_budget_is_shared_and_waiting_prefills_get_what_is_left() -> None:
    sched = make_scheduler(max_num_batched_tokens=8, prefill_chunk_size=8)
    add(sched, "A", 10)
    add(sched, "B", 10)
    add(sched, "C", 3)
    out = step(sched)
    assert chunks(out) == [("A", 0, 8, True)]
    assert ids(sched.waiting) == ["B", "C"]  # no budget left: B waits, and C behind it
    out = step(sched)
    assert chunks(out) == [("A", 8, 2, True), ("B", 0, 6, True)]
    assert ids(sched.waiting) == ["C"]
    out = step(sched)
    assert chunks(out) == [("A", 10, 1, False), ("B", 6, 4, True), ("C", 0, 3, True)]
    assert (out.num_decode_tokens, out.num_prefill_tokens) == (1, 7)


def test_without_chunking_a_prompt_waits_until_the_budget_holds_it_whole() -> None:
    sched = make_scheduler(max_num_batched_tokens=8, prefill_chunk_size=0)
    add(sched, "A", 5, max_tokens=2)
    add(sched, "B", 8)
    assert chunks(step(sched)) == [("A", 0, 5, True)]
    assert ids(sched.waiting) == ["B"]  # 3 tokens of budget left, B needs 8
    assert chunks(step(sched)) == [("A", 5, 1, False)]  # A's decode leaves 7; A finishes
    assert ids(sched.waiting) == ["B"]
    assert chunks(step(sched)) == [("B", 0, 8, True)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("fcfs", []), ("shortest_first", [("Y", 0, 2, True)])],
)
def test_without_chunking_a_prompt_over_the_budget_never_runs(policy: str, expected: list) -> None:
    sched = make_scheduler(max_num_batched_tokens=8, prefill_chunk_size=0, policy=policy)
    add(sched, "X", 9)
    add(sched, "Y", 2)
    assert chunks(step(sched)) == expected  # fcfs: X blocks the queue (no skipping)
    for _ in range(3):
        step(sched)
    assert ids(sched.waiting) == ["X", "Y"][: 2 - len(expected)]
    assert ids(sched.running) == ids(c[0] for c in expected)


def test_max_num_seqs_limits_the_batch_and_freed_slots_are_reused() -> None:
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk_size=64)
    add(sched, "A", 3, max_tokens=1)
    add(sched, "B", 3)
    add(sched, "C", 3)
    out = sched.schedule()
    assert [(c.req.request_id, c.slot) for c in out.chunks] == [("A", 0), ("B", 1)]
    assert ids(sched.waiting) == ["C"]
    assert ids(complete(sched, out)) == ["A"]  # max_tokens 1: done after its prefill
    out = sched.schedule()
    assert [(c.req.request_id, c.slot) for c in out.chunks] == [("B", 1), ("C", 0)]
    assert chunks(out) == [("B", 3, 1, False), ("C", 0, 3, True)]


def test_lowering_max_num_seqs_schedules_only_that_many_running() -> None:
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=16, prefill_chunk_size=16)
    for rid in "ABC":
        add(sched, rid, 2)
    step(sched)
    set_knobs(sched, max_num_seqs=2)
    out = step(sched)
    assert chunks(out) == [("A", 2, 1, False), ("B", 2, 1, False)]
    assert ids(sched.running) == ["A", "B", "C"]  # C keeps its slot and blocks, idle


# KV watermark


@pytest.mark.parametrize(("prompt", "admitted"), [(12, True), (13, False)])
def test_watermark_holds_back_admission_while_decodes_run(prompt: int, admitted: bool) -> None:
    # 10 blocks, watermark int(0.3 * 10) = 3: A holds 4, so a newcomer may take 6 - 3 = 3
    sched = make_scheduler(num_blocks=10, kv_watermark=0.3)
    add(sched, "A", 15)
    step(sched)
    add(sched, "B", prompt)
    add(sched, "C", 1)  # one block; fits beside A unless B holds the queue
    out = step(sched)
    expected = [("A", 15, 1, False)] + ([("B", 0, prompt, True)] if admitted else [])
    assert chunks(out) == expected
    # admitted: B leaves 3 allocatable, all watermark; held: C may not skip past B
    assert ids(sched.waiting) == (["C"] if admitted else ["B", "C"])
    if not admitted:
        set_knobs(sched, kv_watermark=0.0)
        out = step(sched)
        assert chunks(out) == [("A", 16, 1, False), ("B", 0, 13, True), ("C", 0, 1, True)]


def test_idle_engine_admits_a_request_needing_every_usable_block() -> None:
    sched = make_scheduler(num_blocks=10, kv_watermark=0.5)
    add(sched, "A", 40)
    assert chunks(step(sched)) == [("A", 0, 40, True)]
    assert sched.blocks.num_allocatable == 0


# policies


POLICY_CASES = [
    # A: 5 tokens, priority 2; B: 9 tokens, priority 0; C: 3 tokens, priority 1
    ("fcfs", ["A", "B", "C"]),
    ("priority", ["B", "C", "A"]),
    ("shortest_first", ["C", "A", "B"]),
]


def _three_requests(sched: Scheduler) -> dict[str, Request]:
    return {
        "A": add(sched, "A", 5, priority=2),
        "B": add(sched, "B", 9, priority=0),
        "C": add(sched, "C", 3, priority=1),
    }


@pytest.mark.parametrize(("policy", "order"), POLICY_CASES)
def test_policy_orders_admission_and_decodes(policy: str, order: list[str]) -> None:
    sched = make_scheduler(policy=policy)
    reqs = _three_requests(sched)
    out = step(sched)
    assert chunks(out) == [(r, 0, reqs[r].num_prompt_tokens, True) for r in order]
    out = step(sched)
    assert chunks(out) == [(r, reqs[r].num_prompt_tokens, 1, False) for r in order]


@pytest.mark.parametrize(("policy", "order"), POLICY_CASES)
def test_policy_picks_who_gets_the_only_slot(policy: str, order: list[str]) -> None:
    sched = make_scheduler(policy=policy, max_num_seqs=1)
    _three_requests(sched)
    out = step(sched)
    assert ids(c.req for c in out.chunks) == order[:1]
    assert sorted(ids(sched.waiting)) == sorted(order[1:])


# preemption


def _three_running(sched: Scheduler, priorities: tuple[int, int, int]) -> dict[str, Request]:
    """A (5 tokens), B (8), C (6) in 6 blocks, two each; after one step B's decode needs a
    third block, A's and C's do not."""
    reqs = {
        rid: add(sched, rid, n, priority=p)
        for rid, n, p in zip("ABC", (5, 8, 6), priorities, strict=True)
    }
    step(sched)
    assert sched.blocks.num_allocatable == 0
    reqs["D"] = add(sched, "D", 3)  # waits: nothing is admitted in a step that preempts
    return reqs


PREEMPT_CASES = [
    # fcfs: order A, B, C; B needs a block; the newest unscheduled (C) goes
    ("fcfs", (0, 0, 0), "C", [("A", 5, 1, False), ("B", 8, 1, False)]),
    # priority: order B, C, A; B needs a block; A has the highest key
    ("priority", (2, 0, 1), "A", [("B", 8, 1, False), ("C", 6, 1, False)]),
    # shortest_first: order A, C, B; only B itself is left unscheduled: it preempts itself
    ("shortest_first", (0, 0, 0), "B", [("A", 5, 1, False), ("C", 6, 1, False)]),
]


@pytest.mark.parametrize(("policy", "priorities", "victim", "expected"), PREEMPT_CASES)
def test_recompute_preempts_the_highest_key_and_requeues_it_first(
    policy: str, priorities: tuple[int, int, int], victim: str, expected: list
) -> None:
    sched = make_scheduler(num_blocks=6, policy=policy, preemption_mode="recompute")
    reqs = _three_running(sched, priorities)
    v = reqs[victim]
    slot = v.slot
    out = step(sched)
    assert chunks(out) == expected
    assert ids(out.preempted) == [victim]
    assert (out.swap_out, out.swap_in) == ([], [])
    assert ids(sched.waiting) == [victim, "D"]
    assert (v.status, v.num_computed_tokens, v.block_table, v.slot) == (Status.WAITING, 0, [], None)
    assert v.num_preemptions == 1
    assert len(v.output_token_ids) == 1  # generated tokens are kept and prefilled again
    assert sorted(sched.free_slots) == [slot]


def test_a_decode_with_the_highest_key_preempts_itself_not_an_unscheduled_prefill() -> None:
    sched = make_scheduler(
        num_blocks=4, policy="priority", max_num_batched_tokens=16, prefill_chunk_size=8
    )
    add(sched, "D", 8, priority=5)
    add(sched, "P", 16, priority=0)
    assert chunks(step(sched)) == [("P", 0, 8, True), ("D", 0, 8, True)]
    # D decodes first and needs a third block; D's key (5, ...) beats P's (0, ...)
    out = step(sched)
    assert ids(out.preempted) == ["D"]
    assert chunks(out) == [("P", 8, 8, True)]
    assert ids(sched.waiting) == ["D"]


@pytest.mark.parametrize(("policy", "priorities", "victim", "expected"), PREEMPT_CASES)
def test_swap_preempts_the_highest_key_into_host_blocks(
    policy: str, priorities: tuple[int, int, int], victim: str, expected: list
) -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, policy=policy, preemption_mode="swap")
    reqs = _three_running(sched, priorities)
    v = reqs[victim]
    device_blocks, computed = list(v.block_table), v.num_computed_tokens
    out = step(sched)
    assert chunks(out) == expected
    assert ids(out.preempted) == [victim]
    assert out.swap_out == [(device_blocks[0], 0), (device_blocks[1], 1)]
    assert (ids(sched.swapped), ids(sched.waiting)) == ([victim], ["D"])
    assert (v.status, v.host_blocks, v.block_table) == (Status.SWAPPED, [0, 1], [])
    assert v.num_computed_tokens == computed  # its KV is kept on the host
    assert list(sched.blocks.host_free) == [2, 3, 4, 5, 6, 7]


def test_swapped_request_comes_back_before_waiting_ones() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, preemption_mode="swap")
    reqs = _three_running(sched, (0, 0, 0))
    out = step(sched)  # B needs a block; C (newest) is swapped out
    assert (ids(out.preempted), ids(sched.swapped)) == (["C"], ["C"])
    sched.finish(reqs["A"], "abort")  # frees two blocks
    c = reqs["C"]
    out = step(sched)
    assert out.swap_in == list(zip([0, 1], c.block_table[:2], strict=True))
    assert out.preempted == [] and out.swap_out == []
    # the swapped-in decode, then D: admitted now that nothing is swapped
    assert chunks(out) == [("B", 9, 1, False), ("C", 6, 1, False), ("D", 0, 3, True)]
    assert (c.host_blocks, sorted(sched.blocks.host_free)) == ([], list(range(8)))


@pytest.mark.parametrize(
    ("knobs", "back"),
    [({}, True), ({"kv_watermark": 0.4}, False), ({"max_num_seqs": 1}, False)],
)
def test_swap_in_needs_a_slot_and_blocks_above_the_watermark(
    knobs: dict[str, Any], back: bool
) -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, preemption_mode="swap")
    reqs = _three_running(sched, (0, 0, 0))
    step(sched)  # C swapped out
    sched.finish(reqs["A"], "abort")  # 3 blocks allocatable; C needs 2
    set_knobs(sched, **knobs)  # watermark int(0.4 * 6) = 2 leaves 1 for C; or no free slot
    out = step(sched)
    if back:
        assert ids(c.req for c in out.chunks) == ["B", "C", "D"]
    else:
        assert (chunks(out), out.swap_in) == ([("B", 9, 1, False)], [])
        assert (ids(sched.swapped), ids(sched.waiting)) == (["C"], ["D"])


def test_swap_in_needs_token_budget() -> None:
    sched = make_scheduler(
        num_blocks=20,
        num_host_blocks=8,
        preemption_mode="swap",
        policy="priority",
        max_num_batched_tokens=8,
        prefill_chunk_size=8,
    )
    add(sched, "S", 8, priority=5)
    step(sched)
    add(sched, "A", 40, priority=0)
    assert chunks(step(sched)) == [("S", 8, 1, False), ("A", 0, 7, True)]
    set_knobs(sched, kv_capacity_blocks=4)  # S (3 blocks) + A (2) > 4: S has the higher key
    out = step(sched)
    assert (ids(out.preempted), chunks(out)) == (["S"], [("A", 7, 8, True)])
    set_knobs(sched, kv_capacity_blocks=None)
    for start in (15, 23, 31):  # A's chunks take the whole budget: S stays out
        out = step(sched)
        assert (chunks(out), ids(sched.swapped)) == ([("A", start, 8, True)], ["S"])
    out = step(sched)
    assert chunks(out) == [("A", 39, 1, True), ("S", 9, 1, False)]


def test_waiting_requests_wait_while_one_is_swapped() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, preemption_mode="swap")
    _three_running(sched, (0, 0, 0))
    step(sched)  # C swapped out
    out = step(sched)  # no room to bring C back (needs 2 of 1 allocatable): D may not jump it
    assert chunks(out) == [("A", 6, 1, False), ("B", 9, 1, False)]
    assert (ids(sched.swapped), ids(sched.waiting)) == (["C"], ["D"])


def test_nothing_is_swapped_in_during_a_step_that_preempts() -> None:
    sched = make_scheduler(num_blocks=10, num_host_blocks=8, preemption_mode="swap")
    add(sched, "A", 7)
    add(sched, "B", 15)
    add(sched, "S", 3)
    step(sched)
    set_knobs(sched, kv_capacity_blocks=6)
    out = step(sched)
    assert (ids(out.preempted), ids(sched.swapped)) == (["S"], ["S"])
    set_knobs(sched, kv_capacity_blocks=5)
    out = step(sched)
    # B goes; that leaves room for S (1 block), but S must wait for the next step
    assert (ids(out.preempted), out.swap_in) == (["B"], [])
    assert chunks(out) == [("A", 8, 1, False)]
    assert ids(sched.swapped) == ["S", "B"]
    out = step(sched)  # S comes back; B (4 blocks) does not fit behind it
    assert out.swap_in == [(0, sched.running[-1].block_table[0])]
    assert chunks(out) == [("A", 9, 1, False), ("S", 3, 1, False)]
    assert ids(sched.swapped) == ["B"]


def test_swap_falls_back_to_recompute_when_the_host_pool_is_too_small() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=1, preemption_mode="swap")
    reqs = _three_running(sched, (0, 0, 0))
    out = step(sched)
    c = reqs["C"]
    assert ids(out.preempted) == ["C"] and out.swap_out == []
    assert (c.status, c.num_computed_tokens, c.host_blocks) == (Status.WAITING, 0, [])
    assert (ids(sched.waiting), list(sched.swapped)) == (["C", "D"], [])
    assert list(sched.blocks.host_free) == [0]


def test_recompute_victim_readmits_with_its_cached_prefix() -> None:
    sched = make_scheduler(num_blocks=6, preemption_mode="recompute")
    reqs = _three_running(sched, (0, 0, 0))
    sched.finish(reqs["D"], "abort")
    c = reqs["C"]
    first_block = c.block_table[0]
    step(sched)  # C preempted; its full first block stays cached
    assert sched.blocks.blocks[first_block].ref_count == 0
    assert first_block in sched.blocks.cached
    sched.finish(reqs["A"], "abort")
    out = step(sched)
    assert chunks(out) == [("B", 9, 1, False), ("C", 4, 3, True)]
    assert c.block_table[0] == first_block


# capacity changes


def test_lowering_kv_capacity_preempts_down_to_it() -> None:
    sched = make_scheduler(num_blocks=12, preemption_mode="recompute")
    for rid in "ABC":
        add(sched, rid, 7)
    step(sched)
    assert sched.blocks.num_used == 6
    set_knobs(sched, kv_capacity_blocks=3)
    out = step(sched)
    assert ids(out.preempted) == ["C", "B"]  # highest key first, until used <= usable
    assert chunks(out) == [("A", 7, 1, False)]
    assert ids(sched.waiting) == ["B", "C"]
    assert (sched.blocks.usable, sched.blocks.num_used) == (3, 2)
    assert sched.blocks.num_used + sched.blocks.num_cached <= 3


def test_swap_in_follows_swap_out_order_after_capacity_comes_back() -> None:
    sched = make_scheduler(num_blocks=12, num_host_blocks=8, preemption_mode="swap")
    reqs = {rid: add(sched, rid, 7) for rid in "ABC"}
    step(sched)
    tables = {rid: list(r.block_table) for rid, r in reqs.items()}
    set_knobs(sched, kv_capacity_blocks=3)
    out = step(sched)
    assert ids(out.preempted) == ["C", "B"]
    assert out.swap_out == [
        (tables["C"][0], 0),
        (tables["C"][1], 1),
        (tables["B"][0], 2),
        (tables["B"][1], 3),
    ]
    assert ids(sched.swapped) == ["C", "B"]
    out = step(sched)  # A grows into the last usable block; no room to swap in
    assert (chunks(out), out.swap_in) == ([("A", 8, 1, False)], [])
    set_knobs(sched, kv_capacity_blocks=None)
    out = step(sched)
    c, b = reqs["C"], reqs["B"]
    assert out.swap_in == [(0, c.block_table[0]), (1, c.block_table[1])] + [
        (2, b.block_table[0]),
        (3, b.block_table[1]),
    ]
    assert chunks(out) == [("A", 9, 1, False), ("C", 7, 1, False), ("B", 7, 1, False)]
    assert list(sched.swapped) == []


# prefix cache


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_hit_shares_blocks_and_costs_only_new_ones(prefix_caching: bool) -> None:
    sched = make_scheduler(num_blocks=4, prefix_caching=prefix_caching)
    a = add(sched, "A", 10, max_tokens=3)
    step(sched)
    b = add(sched, "B", [*a.prompt_token_ids[:8], 1, 2, 3], max_tokens=2)
    out = step(sched)
    bm = sched.blocks
    if not prefix_caching:  # B would need 3 blocks, 1 is allocatable
        assert chunks(out) == [("A", 10, 1, False)]
        assert ids(sched.waiting) == ["B"]
        return
    assert chunks(out) == [("A", 10, 1, False), ("B", 8, 3, True)]
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2, 1]
    shared = b.block_table[:2]
    assert (bm.num_used, bm.prefix_hits, bm.prefix_queries) == (4, 8, 21)
    sched.finish(a, "abort")
    assert [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]
    sched.finish(b, "abort")
    assert (bm.num_used, bm.num_cached) == (0, 2)
    assert list(bm.cached) == shared[::-1]
    c = add(sched, "C", list(b.prompt_token_ids), max_tokens=2)
    out = step(sched)  # a hit on cached blocks: they become used again
    assert chunks(out) == [("C", 8, 3, True)]
    assert c.block_table[:2] == shared
    assert (bm.num_used, bm.num_cached) == (3, 0)
    drain(sched)
    assert_all_blocks_back(sched)


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    sched = make_scheduler()
    a = add(sched, "A", 10)
    step(sched)
    add(sched, "B", a.prompt_token_ids[:8])  # two full cached blocks: only the first is a hit
    out = step(sched)
    assert chunks(out) == [("A", 10, 1, False), ("B", 4, 4, True)]


def test_cached_blocks_are_evicted_least_recently_used_first() -> None:
    sched = make_scheduler(num_blocks=6)
    a = add(sched, "A", 9, max_tokens=1)
    b = add(sched, "B", 9, max_tokens=1)
    step(sched)  # both done: two full blocks each cached, A's freed first
    bm = sched.blocks
    assert (a.block_table, b.block_table) == ([], [])
    assert (bm.num_used, list(bm.cached), list(bm.free_ids)) == (0, [1, 0, 4, 3], [2, 5])
    # C needs 3 blocks: the two free ones, then the least recently used cached one
    c = add(sched, "C", 11, max_tokens=2)
    step(sched)
    assert c.block_table == [2, 5, 1]
    assert list(bm.cached) == [0, 4, 3]
    assert bm.prefix_match(Request(a.prompt_token_ids, a.params)) == [0]
    assert bm.prefix_match(Request(b.prompt_token_ids, b.params)) == [3, 4]
    b2 = add(sched, "B2", b.prompt_token_ids, max_tokens=2)
    out = step(sched)
    assert chunks(out) == [("C", 11, 1, False), ("B2", 8, 1, True)]
    assert b2.block_table[:2] == [3, 4]
    drain(sched)
    assert_all_blocks_back(sched)


# static batching


def test_static_batching_holds_decodes_and_new_requests_until_the_batch_ends() -> None:
    sched = make_scheduler(batching="static", max_num_batched_tokens=8, prefill_chunk_size=4)
    add(sched, "A", 3, max_tokens=2)
    add(sched, "B", 10, max_tokens=3)
    assert chunks(step(sched)) == [("A", 0, 3, True), ("B", 0, 4, True)]
    add(sched, "C", 2)
    assert chunks(step(sched)) == [("B", 4, 4, True)]  # A's decode waits for B's prefill
    assert chunks(step(sched)) == [("B", 8, 2, True)]
    assert chunks(step(sched)) == [("A", 3, 1, False), ("B", 10, 1, False)]  # A finishes
    assert ids(sched.waiting) == ["C"]
    assert chunks(step(sched)) == [("B", 11, 1, False)]  # B finishes; C still waits
    assert chunks(step(sched)) == [("C", 0, 2, True)]


@pytest.mark.parametrize(("batching", "admitted"), [("static", ["A"]), ("continuous", ["A", "B"])])
def test_static_batching_reserves_whole_prompts(batching: Batching, admitted: list[str]) -> None:
    sched = make_scheduler(
        num_blocks=5, batching=batching, max_num_batched_tokens=8, prefill_chunk_size=4
    )
    add(sched, "A", 12)
    add(sched, "B", 12)
    out = step(sched)
    assert ids(c.req for c in out.chunks) == admitted


def test_static_batching_reserves_across_admissions() -> None:
    sched = make_scheduler(
        num_blocks=8, batching="static", max_num_batched_tokens=8, prefill_chunk_size=4
    )
    for rid, n in (("A", 12), ("B", 12), ("C", 8), ("D", 4)):
        add(sched, rid, n)
    out = step(sched)
    # A and B reserve 3 blocks each (1 allocated now), C 2 with no budget left: 8 in all,
    # so D (1 more) waits; C runs in the batch from the next step
    assert chunks(out) == [("A", 0, 4, True), ("B", 0, 4, True)]
    assert (ids(sched.running), ids(sched.waiting)) == (["A", "B", "C"], ["D"])
    assert chunks(step(sched)) == [("A", 4, 4, True), ("B", 4, 4, True)]
    assert chunks(step(sched)) == [("A", 8, 4, True), ("B", 8, 4, True)]
    assert chunks(step(sched)) == [("C", 0, 4, True)]  # decodes wait for C's prefill


# no leaks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority", "shortest_first"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_every_block_comes_back_after_a_tight_workload(
    mode: str, policy: str, prefix_caching: bool
) -> None:
    sched = make_scheduler(
        num_blocks=8,
        num_host_blocks=6,
        prefix_caching=prefix_caching,
        policy=policy,
        preemption_mode=mode,
        max_num_seqs=4,
        max_num_batched_tokens=12,
        prefill_chunk_size=5,
        kv_watermark=0.1,
    )
    shared = list(range(500, 508))  # two full blocks that odd-numbered requests share
    reqs = []
    for i in range(8):
        prompt = [*shared, *[i] * (i % 4)] if i % 2 else 3 + i
        reqs.append(add(sched, f"R{i}", prompt, max_tokens=4 + i % 5, priority=i % 3))
    outs = drain(sched)
    assert [len(r.output_token_ids) for r in reqs] == [r.params.max_tokens for r in reqs]
    assert {r.finish_reason for r in reqs} == {"length"}
    assert sum(r.num_preemptions for r in reqs) > 0
    assert any(o.swap_out for o in outs) == (mode == "swap")
    assert any(o.swap_in for o in outs) == (mode == "swap")
    assert all(sum(c.num_tokens for c in o.chunks) <= 12 and len(o.chunks) <= 4 for o in outs)
    assert_all_blocks_back(sched, num_host_blocks=6)
    if prefix_caching:
        assert sched.blocks.prefix_hits > 0


def test_finishing_from_every_queue_returns_every_block() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, preemption_mode="swap")
    reqs = _three_running(sched, (0, 0, 0))
    step(sched)  # C swapped, D waiting, A and B running
    assert (reqs["C"].status, reqs["D"].status) == (Status.SWAPPED, Status.WAITING)
    for rid in "CDAB":
        sched.finish(reqs[rid], "abort")
        check_state(sched)
    assert {r.finish_reason for r in reqs.values()} == {"abort"}
    assert_all_blocks_back(sched, num_host_blocks=8)


# why requests were left waiting (StepTelemetry.sched, for latency attribution)


def _arrive(sched: Scheduler, rid: str, prompt: int, t: float, priority: int = 0) -> Request:
    req = add(sched, rid, prompt, priority=priority)
    req.arrival = t
    return req


@pytest.mark.parametrize(
    ("setup", "blocked"),
    [
        ({"max_num_seqs": 1}, "slots"),
        ({"max_num_batched_tokens": 16, "prefill_chunk_size": 0}, "budget"),
        ({"num_blocks": 5}, "kv"),
        ({"batching": "static", "max_num_seqs": 1}, "slots"),
    ],
)
def test_the_head_left_waiting_is_blocked_by_the_limit_it_hit(
    setup: dict[str, Any], blocked: str
) -> None:
    sched = make_scheduler(**setup)
    _arrive(sched, "A", 12, 1.0)
    _arrive(sched, "B", 12, 2.0)
    out = step(sched)
    assert ids(sched.waiting) == ["B"]
    assert (out.blocked, out.ahead_arrival) == (blocked, 2.0)


def test_nothing_left_waiting_blocks_nothing() -> None:
    sched = make_scheduler()
    _arrive(sched, "A", 12, 1.0)
    out = step(sched)
    assert (out.blocked, out.ahead_arrival) == (None, 1.0)
    out = step(sched)  # a decode, nothing waiting, nothing admitted
    assert (out.blocked, out.ahead_arrival) == (None, None)


def test_a_request_passed_over_by_the_policy_arrived_before_the_latest_ahead() -> None:
    sched = make_scheduler(max_num_seqs=1, policy="priority")
    _arrive(sched, "A", 12, 1.0, priority=5)
    _arrive(sched, "B", 12, 2.0, priority=0)
    out = step(sched)
    assert ids(sched.waiting) == ["A"]
    assert out.blocked == "slots"
    assert out.ahead_arrival is not None and out.ahead_arrival > sched.waiting[0].arrival


def test_static_batching_blocks_admission_until_the_batch_ends() -> None:
    sched = make_scheduler(batching="static")
    _arrive(sched, "A", 12, 1.0)
    step(sched)
    _arrive(sched, "B", 4, 2.0)
    out = step(sched)
    assert (out.blocked, out.ahead_arrival) == ("static", 2.0)


def test_waiting_behind_a_swapped_request_and_behind_a_preemption() -> None:
    sched = make_scheduler(num_blocks=6, num_host_blocks=8, preemption_mode="swap")
    _three_running(sched, (0, 0, 0))
    out = step(sched)  # C swapped out: D may not be admitted in a step that preempts
    assert ids(out.preempted) == ["C"]
    assert out.blocked == "kv"
    out = step(sched)
    assert (ids(sched.swapped), ids(sched.waiting)) == (["C"], ["D"])
    assert out.blocked == "swapped"


def test_a_resumed_request_decodes_on_with_its_kv_in_place() -> None:
    """A live engine's running request entering its twin: all but its last token in KV, so its
    first step is that one token, sampled; without the blocks it waits to prefill again."""
    sched = make_scheduler(num_blocks=8)
    req = Request([next(_tokens) for _ in range(21)], SamplingParams(max_tokens=3), "r")
    sched.resume(req, 20)
    assert req.status is Status.RUNNING and len(req.block_table) == 5
    out = sched.schedule()
    assert [(c.req, c.start, c.num_tokens, c.sample) for c in out.chunks] == [(req, 20, 1, True)]
    complete(sched, out)
    assert sched.schedule().chunks[0].num_tokens == 1  # a decode
    late = Request([next(_tokens) for _ in range(21)], SamplingParams(max_tokens=3), "late")
    sched.resume(late, 20)  # 6 blocks taken, 5 more needed of 8
    assert late.status is Status.WAITING and list(sched.waiting) == [late]
    assert late.num_computed_tokens == 0 and not late.block_table
