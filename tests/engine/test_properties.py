"""Random workloads with staggered arrivals, aborts and live knob changes keep the engine sound.

Checked at every step: the batch respects the knobs applied in that step, KV blocks are
accounted for exactly (free, cached, used; ref counts equal block-table references; host
blocks are either free or held by a swapped request), and queues match the telemetry.
Once everything is done, no request is left unfinished and every block is back, and each
request produced the same tokens as it does in one big batch on a roomy engine (greedy or
seeded sampling, dropless MoE): scheduling, preemption and swapping never change results.
"""

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import LLMEngine, RequestDelta, RequestOutput, SamplingParams, StepTelemetry
from engine.errors import InvalidInput
from engine.request import Request, Status

BLOCK_SIZE = 4
# prompts are mostly block-sized "words" from a small set: prompts share prefixes (prefix
# cache hits) and the same block content shows up at different positions
WORDS = [list(range(40 + 4 * i, 44 + 4 * i)) for i in range(3)]

KNOB_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "max_num_seqs": st.integers(1, 8),
        "max_num_batched_tokens": st.sampled_from([1, 2, 5, 8, 16, 32, 64, 1024]),
        "prefill_chunk_size": st.sampled_from([0, 1, 3, 8, 16, 32]),
        "policy": st.sampled_from(["fcfs", "priority", "shortest_first"]),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "kv_watermark": st.sampled_from([0.0, 0.01, 0.1, 0.3, 0.5]),
        "kv_capacity_blocks": st.one_of(st.none(), st.integers(4, 32)),
    },
)
PROMPTS = st.builds(
    lambda words, tail: [t for w in words for t in w] + tail or [256],
    st.lists(st.sampled_from(WORDS), max_size=6),
    st.lists(st.integers(0, 255), max_size=8),
)
ADD = st.tuples(st.just("add"), PROMPTS, st.integers(1, 16), st.integers(0, 3), st.booleans())
ABORT = st.tuples(st.just("abort"), st.integers(0, 20))
KNOBS = st.tuples(st.just("knobs"), KNOB_CHANGES)
ACTION = st.one_of(ADD, ADD, ADD, ABORT, KNOBS)  # mostly arrivals, so the KV cache fills up
BURST = st.lists(ADD, min_size=2, max_size=8)  # arrivals before the first step
SCRIPT = st.lists(st.lists(ACTION, max_size=3), min_size=4, max_size=24)
ENGINE_ARGS = st.fixed_dictionaries(
    {
        "num_kv_blocks": st.integers(14, 32),
        "num_host_blocks": st.sampled_from([0, 16, 64]),
        "enable_prefix_caching": st.booleans(),
        "max_num_seqs": st.integers(1, 6),
        "max_num_batched_tokens": st.sampled_from([8, 16, 64]),
        "prefill_chunk_size": st.sampled_from([4, 8]),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "kv_watermark": st.sampled_from([0.0, 0.1]),
    }
)


def filled_slots(running: list[Request], block_size: int) -> int:
    """KV token slots holding computed tokens, counting each (possibly shared) block once."""
    fill: dict[int, int] = {}
    for req in running:
        for i, block in enumerate(req.block_table):
            filled = min(block_size, req.num_computed_tokens - i * block_size)
            fill[block] = max(fill.get(block, 0), filled)
    return sum(fill.values())


class Workload:
    """Drives one engine through a script and checks it after every step."""

    def __init__(self, engine_args: dict[str, Any]) -> None:
        self.engine = LLMEngine(model="synthetic:tiny", block_size=BLOCK_SIZE, **engine_args)
        self.num_host_blocks: int = engine_args["num_host_blocks"]
        self.params: dict[str, SamplingParams] = {}
        self.prompts: dict[str, list[int]] = {}
        self.preempted = 0
        self.max_swapped = 0
        self.ids: list[str] = []
        self.aborted: set[str] = set()
        self.finished: dict[str, RequestOutput] = {}
        self.streamed: dict[str, list[int]] = {}  # each request's tokens from its deltas
        self.version = 1
        self.accepted = self.engine.knobs.model_dump()  # the last accepted knob values
        self.tokens = 0

    def act(self, action: tuple[Any, ...]) -> None:
        if action[0] == "add":
            _, prompt, max_tokens, priority, seeded = action
            params = SamplingParams(
                max_tokens=max_tokens,
                priority=priority,
                temperature=1.0 if seeded else 0.0,
                seed=len(self.ids) if seeded else None,
            )
            try:
                rid = self.engine.add_request(prompt, params)
            except ValueError as err:
                assert "blocks" in str(err)
                return
            self.ids.append(rid)
            self.params[rid] = params
            self.prompts[rid] = prompt
            self.tokens += len(prompt) + max_tokens
        elif action[0] == "abort":
            if self.ids:
                self.abort(self.ids[action[1] % len(self.ids)])
        else:
            self.change_knobs(action[1])

    def abort(self, rid: str) -> None:
        done = rid in self.finished or rid in self.aborted
        record = self.engine.abort(rid)
        assert (record is not None) == (not done)
        assert record is None or (record.req, record.finish_reason) == (rid, "abort")
        self.aborted.add(rid)

    def change_knobs(self, changes: dict[str, Any]) -> None:
        knobs = self.engine.knobs
        try:
            version = self.engine.update_knobs(origin="hypothesis", **changes)
        except InvalidInput:
            assert self.engine.knobs_version == self.version
        else:
            changed = any(self.accepted[k] != v for k, v in changes.items())
            assert version == self.version + changed  # a change to nothing makes no version
            self.version = version
            self.accepted.update(changes)
        assert self.engine.knobs == knobs  # applied only at the next step

    def step(self) -> None:
        result = self.engine.step()
        self.check_telemetry(result.telemetry)
        self.check_blocks()
        self.check_deltas(result.deltas)
        self.check_outputs(result.outputs)
        assert result.telemetry.queue.finished == sum(o.finished for o in result.outputs)
        self.preempted += result.telemetry.queue.preempted
        self.max_swapped = max(self.max_swapped, result.telemetry.queue.swapped)

    def check_telemetry(self, t: StepTelemetry) -> None:
        knobs = self.engine.knobs
        batch, kv = t.batch, t.kv
        assert t.knobs_version == self.engine.applied_knobs_version
        if t.knob_changes:
            assert t.knob_changes[-1].version == t.knobs_version
        assert (batch.max_slots, batch.token_budget) == (
            knobs.max_num_seqs,
            knobs.max_num_batched_tokens,
        )
        assert batch.num_prefill_tokens + batch.num_decode_tokens <= batch.token_budget
        assert len(batch.slots) <= batch.max_slots
        assert sum(s.tokens for s in batch.slots) == (
            batch.num_prefill_tokens + batch.num_decode_tokens
        )
        assert len({s.req for s in batch.slots}) == len(batch.slots)
        for s in batch.slots:
            assert s.tokens >= 1
            assert s.req not in self.aborted
            if s.phase == "decode":
                assert s.tokens == 1
            elif knobs.prefill_chunk_size:
                assert s.tokens <= knobs.prefill_chunk_size
        assert kv.used + kv.cached + kv.free == kv.total
        assert kv.used + kv.cached <= kv.usable <= kv.total
        assert kv.usable == (knobs.kv_capacity_blocks or kv.total)
        sch = self.engine.scheduler
        assert kv.tokens == filled_slots(sch.running, kv.block_size) <= kv.used * kv.block_size
        assert kv.host_used == sum(len(r.host_blocks) for r in sch.swapped)
        q = t.queue
        assert (q.waiting, q.running, q.swapped) == (
            len(sch.waiting),
            len(sch.running),
            len(sch.swapped),
        )

    def check_blocks(self) -> None:
        blocks = self.engine.blocks
        sch = self.engine.scheduler
        assert blocks.num_free + blocks.num_used + blocks.num_cached == blocks.total
        refs = Counter(b for r in sch.running for b in r.block_table)
        assert sum(refs.values()) >= blocks.num_used
        assert len(refs) == blocks.num_used
        for block in (blocks.blocks[i] for i in range(blocks.total)):
            assert block.ref_count == refs[block.block_id]
        free = list(blocks.free_ids)
        assert len(set(free)) == len(free) == blocks.num_free
        assert not set(free) & set(blocks.cached)
        assert not (set(free) | set(blocks.cached)) & set(refs)
        for req in sch.running:
            assert req.status is Status.RUNNING
            assert len(req.block_table) * BLOCK_SIZE >= req.num_computed_tokens
        for req in sch.waiting:
            assert req.status is Status.WAITING and not req.block_table
        host = [h for r in sch.swapped for h in r.host_blocks]
        for req in sch.swapped:
            assert req.status is Status.SWAPPED and not req.block_table
        assert sorted(host + list(blocks.host_free)) == list(range(self.num_host_blocks))

    def check_deltas(self, deltas: list[RequestDelta]) -> None:
        """One new token per sampling request; the last delta holds the whole output, whose
        tokens are those of every delta (preemption and swapping never repeat one)."""
        for d in deltas:
            assert d.request_id not in self.finished and d.request_id not in self.aborted
            assert len(d.token_ids) == len(d.token_times_s) == 1
            self.streamed.setdefault(d.request_id, []).extend(d.token_ids)
            assert d.finished == (d.output is not None)
            if d.output is not None:
                assert d.output.token_ids == self.streamed[d.request_id]
                assert d.output.token_times_s[-1] == d.token_times_s[0]

    def check_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            assert out.request_id not in self.finished
            assert out.request_id not in self.aborted
            params = self.params[out.request_id]
            assert len(out.token_ids) <= params.max_tokens
            if not out.finished:
                continue
            self.finished[out.request_id] = out
            if out.finish_reason == "length":
                assert len(out.token_ids) == params.max_tokens
            else:
                assert out.finish_reason == "stop"
                assert out.token_ids[-1] in self.engine.model_config.eos_token_ids

    def drain(self) -> None:
        limit = 100 + 4 * self.tokens
        for _ in range(limit):
            if not self.engine.has_unfinished():
                break
            self.step()
        assert not self.engine.has_unfinished(), f"still unfinished after {limit} steps"
        blocks = self.engine.blocks
        assert blocks.num_used == 0
        assert len(blocks.host_free) == self.num_host_blocks
        assert self.engine.requests == {}
        assert set(self.finished) | self.aborted == set(self.ids)
        self.step()  # an idle step is still well formed

    def check_against_reference(self) -> None:
        reference = LLMEngine(
            model="synthetic:tiny",
            block_size=BLOCK_SIZE,
            num_kv_blocks=512,
            enable_prefix_caching=False,
        )
        names = {
            reference.add_request(self.prompts[rid], self.params[rid]): rid for rid in self.finished
        }
        expected: dict[str, list[int]] = {}
        while reference.has_unfinished():
            for out in reference.step().outputs:
                if out.finished:
                    expected[names[out.request_id]] = out.token_ids
        assert {rid: out.token_ids for rid, out in self.finished.items()} == expected


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_args=ENGINE_ARGS, burst=BURST, script=SCRIPT)
def test_random_workloads_stay_sound(
    engine_args: dict[str, Any], burst: list[tuple[Any, ...]], script: list[list[tuple[Any, ...]]]
) -> None:
    work = Workload(engine_args)
    for action in burst:
        work.act(action)
    for actions in script:
        for action in actions:
            work.act(action)
        work.step()
    work.drain()
    work.check_against_reference()


TIGHT = {
    "num_kv_blocks": 16,
    "num_host_blocks": 32,
    "kv_watermark": 0.0,
    "enable_prefix_caching": False,
}


def tight_workload(mode: str) -> Workload:
    """Four requests that outgrow a 16-block cache while decoding, so some get preempted."""
    work = Workload({**TIGHT, "preemption_mode": mode})
    for i in range(4):
        work.act(("add", [256, *range(10 + i, 29 + i)], 20, 0, i % 2 == 1))
    return work


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_requests_produce_the_same_tokens(mode: str) -> None:
    work = tight_workload(mode)
    work.drain()
    assert work.preempted > 0
    assert (work.max_swapped > 0) == (mode == "swap")
    work.check_against_reference()


def test_abort_in_every_state_returns_all_blocks() -> None:
    work = tight_workload("swap")
    work.act(("add", [256, 5, 6, 7], 4, 0, False))
    sch = work.engine.scheduler
    for _ in range(60):
        work.step()
        if sch.swapped and sch.waiting and sch.running:
            break
    assert sch.swapped and sch.waiting and sch.running
    for queue in (sch.swapped, sch.waiting, sch.running):
        work.abort(queue[0].request_id)
    work.drain()
    work.check_against_reference()
